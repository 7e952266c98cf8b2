"""The trained ensemble: batched inference, vote histograms and teacher accuracy.

A vote histogram row counts, per class, the teachers that predict it (Papernot et al., ICLR 2017,
eq. 1); every row sums to the number of teachers. Inference maps each shard's stacked parameters
over a batch of inputs with ``torch.func.vmap`` (one call per shard and batch, no loop over
teachers or examples). On a CPU small batches are much faster per prediction (measured on 2
cores: 25 teachers x 16 rows 96 us per prediction, x 256 rows 177 us: the activations of a
large batch overflow the caches), so the default batch there is 32 rows; on a GPU 1024.
Votes are private (docs/design.md): callers write them with mode 0600.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call, vmap
from tqdm import tqdm

from pate.data.datasets import load_dataset, public_split
from pate.errors import UserError
from pate.io import write_with_atomic
from pate.rundir import RunDir
from teachers import checkpoints
from teachers.models import build_model


class Ensemble:
    """All teachers of a run, shard by shard, on one device; ``encoder`` is the run's frozen
    pool encoder for the architectures that use one (one copy shared by all teachers: rows are
    the same for every teacher, so vmap evaluates it once per batch)."""

    def __init__(self, model: str, in_shape: tuple[int, int, int], num_classes: int,
                 shards: list[dict[str, torch.Tensor]], device: str = "cpu",
                 encoder: dict[str, torch.Tensor] | None = None) -> None:
        self.num_classes = num_classes
        self.in_shape = tuple(in_shape)
        self.device = torch.device(device)
        self.shards = shards
        self.num_teachers = sum(next(iter(p.values())).shape[0] for p in shards)
        base = build_model(model, self.in_shape, num_classes, encoder).to(self.device).eval()
        self._forward = vmap(lambda p, xb: functional_call(base, p, (xb,)), in_dims=(0, None))

    def labels(self, x: np.ndarray, batch_size: int | None = None, desc: str | None = None
               ) -> Iterator[torch.Tensor]:
        """For each batch of rows of ``x``, the labels ``[num_teachers, b]`` of every teacher;
        with ``desc``, a progress bar when stderr is a terminal."""
        if x.ndim != 4 or tuple(x.shape[1:]) != self.in_shape:
            raise UserError(f"inputs must have shape [n, {', '.join(map(str, self.in_shape))}],"
                            f" got {list(x.shape)}")
        batch_size = batch_size or (32 if self.device.type == "cpu" else 1024)
        starts = tqdm(range(0, len(x), batch_size), desc=desc, unit="batch",
                      disable=desc is None or not sys.stderr.isatty())
        with torch.no_grad():
            for i in starts:
                xb = torch.as_tensor(np.ascontiguousarray(x[i:i + batch_size]),
                                     dtype=torch.float32, device=self.device)
                yield torch.cat([self._forward(p, xb).argmax(-1) for p in self.shards])

    def vote(self, x: np.ndarray, batch_size: int | None = None, desc: str | None = None
             ) -> np.ndarray:
        """Vote histograms ``int32 [n, num_classes]`` of the teachers on the rows of ``x``."""
        out = [torch.nn.functional.one_hot(lab, self.num_classes).sum(0, dtype=torch.int32)
               for lab in self.labels(x, batch_size, desc)]
        if not out:
            return np.zeros((0, self.num_classes), dtype=np.int32)
        return torch.cat(out).cpu().numpy()

    def accuracy(self, x: np.ndarray, y: np.ndarray, batch_size: int | None = None,
                 desc: str | None = None) -> np.ndarray:
        """Each teacher's accuracy ``[num_teachers]`` on the labelled rows ``(x, y)``."""
        hits = torch.zeros(self.num_teachers, dtype=torch.int64, device=self.device)
        yt = torch.as_tensor(y, device=self.device)
        start = 0
        for lab in self.labels(x, batch_size, desc):
            hits += (lab == yt[start:start + lab.shape[1]]).sum(1)
            start += lab.shape[1]
        return (hits.double() / len(y)).cpu().numpy()


def load_ensemble(run_dir: str | Path, device: str = "cpu") -> Ensemble:
    """The teachers of ``run_dir`` (all shards must be trained), ready to vote on ``device``."""
    manifest = checkpoints.read_manifest(Path(run_dir))
    if manifest is None or not manifest.get("done"):
        raise UserError(f"{run_dir} has no fully trained teachers; run `pate teachers train "
                        f"--run {run_dir}` first")
    shards = [checkpoints.load_shard(Path(run_dir), int(i), s["sha256"], device)
              for i, s in sorted(manifest["shards"].items(), key=lambda kv: int(kv[0]))]
    encoder = (checkpoints.load_encoder(Path(run_dir), manifest["pool_encoder"]["sha256"], device)
               if "pool_encoder" in manifest else None)
    return Ensemble(manifest["model"], tuple(manifest["in_shape"]), manifest["num_classes"],
                    shards, device, encoder)


def collect_votes(run_dir: str | Path, device: str = "cpu", data_dir: str | None = None,
                  batch_size: int | None = None) -> int:
    """Write ``votes.npz`` (private: votes int32 [queries, classes], pool_index int64) for the
    public pool of ``run_dir`` and put the teachers' accuracy on the evaluation half, and the
    plurality's accuracy on the pool, into the manifest. Returns the number of queries."""
    run_dir = Path(run_dir)
    ens = load_ensemble(run_dir, device)
    manifest = checkpoints.read_manifest(run_dir)
    ds = load_dataset(manifest["dataset"], data_dir, need_train=False)
    (pool_x, pool_y), (eval_x, eval_y) = public_split(ds, manifest.get("pool_size"))
    votes = ens.vote(pool_x, batch_size, desc="votes on the pool")
    acc = ens.accuracy(eval_x, eval_y, batch_size, desc="teacher accuracy")
    write_with_atomic(RunDir(run_dir).votes, lambda fh: np.savez(
        fh, votes=votes, pool_index=np.arange(len(pool_x), dtype=np.int64)), private=True)
    manifest["accuracy"] = {
        "split": "evaluation", "rows": len(eval_y), "mean": float(acc.mean()),
        "min": float(acc.min()), "max": float(acc.max()), "per_teacher": acc.round(5).tolist(),
        "pool_plurality": float((votes.argmax(1) == pool_y).mean())}
    checkpoints.write_manifest(run_dir, manifest)
    return len(votes)
