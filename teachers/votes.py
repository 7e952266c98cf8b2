"""The trained ensemble: batched inference, vote histograms and teacher accuracy.

A vote histogram row counts, per class, the teachers that predict it (Papernot et al., ICLR 2017,
eq. 1); every row sums to the number of teachers. Inference maps the teachers' stacked
parameters over a batch of inputs with ``torch.func.vmap``, one call per group of teachers
(the shards regrouped by ``vote_groups``) and batch: no loop over teachers or examples. On a CPU
small batches are much faster per prediction (measured on 2 cores: 25 teachers x 16 rows 96 us
per prediction, x 256 rows 177 us: the activations of a large batch overflow the caches), so
the default batch there is 32 rows; on a GPU 1024. Teachers on fixed maps alone (``hog``,
``scatter``, ``hog-scatter``) vote on the maps' table (:meth:`Ensemble.inputs`), computed once
per chunk of rows for all of them.
A user's own network that fails the vmap test in evaluation mode
(:func:`teachers.user_models.vmap_problem`) votes one teacher at a time instead, after one warning
line: the slower path, with the same votes.
Votes are private (docs/design.md): callers write them with mode 0600.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from pate.data.task import load_task
from pate.errors import UserError
from pate.io import write_with_atomic
from pate.progress import progress_bar
from pate.rundir import RunDir
from teachers import checkpoints
from teachers.choices import is_import_path
from teachers.fixed_maps import Columns, feature_table, table_rows, table_width
from teachers.manifest import TeachersManifest
from teachers.models import build_model, on_features
from teachers.user_models import (
    build_user_model,
    check_same_network,
    named_by_class,
    vmap_problem,
    warn_one_at_a_time,
)

# Activations one vmap call may write (32 MB of float32): the shards are regrouped so that
# teachers with small activations (a linear softmax on fixed features) are not voted a shard at
# a time, in many small calls, while those whose activations fill
# the caches (a CNN) keep a shard's worth: on 2 cores 250 `hog` teachers vote on
# the 5 000 pool rows in 0.80 s instead of 1.67 (docs/benchmarks.md); `cnn-pool-hog-simclr`
# teachers voted half as fast in groups of 100 as in shards of 25.
VOTE_GROUP_FLOATS = 1 << 23


def activation_floats(model: nn.Module, in_shape: tuple[int, ...], device: torch.device) -> int:
    """The floats one row's forward writes in ``model``'s leaf modules, in evaluation mode; 0
    where the forward fails on one row of zeros (then no shards are regrouped)."""
    written = [0]

    def count(_module: nn.Module, _inputs: object, out: object) -> None:
        outputs = out if isinstance(out, tuple) else (out,)
        written[0] += sum(t.numel() for t in outputs if isinstance(t, torch.Tensor))

    # a Columns output is a view of the table all teachers share, not written per teacher
    hooks = [m.register_forward_hook(count) for m in model.modules()
             if not any(m.children()) and not isinstance(m, Columns)]
    try:
        with torch.no_grad():
            model.eval()(torch.zeros((1, *in_shape), device=device))
    except Exception:  # a user's network that needs more than one row: keep its shards
        return 0
    finally:
        for hook in hooks:
            hook.remove()
    return written[0]


def vote_groups(stacked: dict[str, torch.Tensor], shard_sizes: list[int], teachers: int
                ) -> list[dict[str, torch.Tensor]]:
    """Views of ``stacked`` (every teacher's tensors, parameters and buffers, the shards'
    concatenated in order) in groups: the shards' own (``shard_sizes``) where ``teachers`` is
    no more than the largest, else groups of ``teachers``."""
    if teachers <= max(shard_sizes, default=0):
        ends = np.cumsum(shard_sizes).tolist()
        bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    else:
        total = sum(shard_sizes)
        bounds = [(start, min(start + teachers, total)) for start in range(0, total, teachers)]
    return [{name: v[a:b] for name, v in stacked.items()} for a, b in bounds]


class Ensemble:
    """All teachers of a run, shard by shard, on one device; ``encoder`` is the run's frozen
    pool encoder for the architectures that use one (one copy shared by all teachers: rows are
    the same for every teacher, so vmap evaluates it once per batch), kept as given."""

    def __init__(self, model: str, in_shape: tuple[int, int, int], num_classes: int,
                 shards: list[dict[str, torch.Tensor]], device: str = "cpu",
                 encoder: dict[str, torch.Tensor] | None = None) -> None:
        self.num_classes = num_classes
        self.in_shape = tuple(in_shape)
        self.encoder = encoder
        self.device = torch.device(device)
        self._sizes = [next(iter(p.values())).shape[0] for p in shards]
        # one copy of every teacher's tensors; the shards and the voting groups are its views
        self._stacked = ({name: torch.cat([p[name] for p in shards]) for name in shards[0]}
                         if len(shards) > 1 else shards[0] if shards else {})
        self.shards = vote_groups(self._stacked, self._sizes, 0)
        self._grouped: dict[int, list[dict[str, torch.Tensor]]] = {}
        self.num_teachers = sum(self._sizes)
        self._base = build_model(model, self.in_shape, num_classes, encoder).to(self.device)
        # a head on fixed maps votes on their table, the maps computed once per chunk of rows
        split = None if is_import_path(model) else on_features(self._base, self.in_shape)
        self._maps = [] if split is None else split[1]
        if split is not None:
            self._base = split[0]
        self._activation = activation_floats(self._base, self._input_shape(), self.device)
        self._vectorised = vmap(lambda p, xb: functional_call(self._base, p, (xb,)),
                                in_dims=(0, None))
        problem = (vmap_problem(model, self._base, shards[0], self.in_shape, num_classes,
                                train=False) if is_import_path(model) and shards else None)
        if problem is not None:
            warn_one_at_a_time(model, problem, "voting with")
        self._one_at_a_time = problem is not None
        self._base.eval()

    def _groups(self, batch_size: int) -> list[dict[str, torch.Tensor]]:
        """The teachers in groups for batches of ``batch_size`` rows: as many a call as write
        about ``VOTE_GROUP_FLOATS`` activations, at least a shard's worth."""
        if batch_size not in self._grouped:
            per_call = self._activation * batch_size
            self._grouped[batch_size] = vote_groups(
                self._stacked, self._sizes, VOTE_GROUP_FLOATS // per_call if per_call else 0)
        return self._grouped[batch_size]

    def _input_shape(self) -> tuple[int, ...]:
        """The shape of one row as the teachers' network reads it: the fixed maps' table row
        (as wide as its last :class:`~teachers.fixed_maps.Columns` reach), else the input's."""
        if not self._maps:
            return self.in_shape
        return (table_width(self._base),)

    def inputs(self, xb: torch.Tensor) -> torch.Tensor:
        """What the teachers' network reads of the rows ``xb``: their fixed maps' table
        (:func:`teachers.fixed_maps.feature_table`) where every path starts with one, else
        ``xb``."""
        return feature_table(self._maps, xb) if self._maps else xb

    def _batch_size(self) -> int:
        """The default rows per batch on this device."""
        return 32 if self.device.type == "cpu" else 1024

    def _forward(self, params: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        """Logits ``[K, b, C]`` of one shard's K teachers (``params`` stacked) on rows
        ``xb`` as :meth:`inputs` gives them: vectorised, or one teacher at a time for a user's
        network vmap cannot map (the slower path)."""
        if not self._one_at_a_time:
            return self._vectorised(params, xb)
        k = next(iter(params.values())).shape[0]
        return torch.stack([functional_call(self._base, {n: v[t] for n, v in params.items()},
                                            (xb,)) for t in range(k)])

    def logits(self, x: np.ndarray, batch_size: int | None = None, desc: str | None = None
               ) -> Iterator[torch.Tensor]:
        """For each batch of rows of ``x``, the outputs ``[num_teachers, b, classes]`` of every
        teacher (an :class:`~teachers.models.Experts` teacher's are log-probabilities); with
        ``desc``, its progress (``pate.progress``: a bar on a terminal, a line every 10 s
        elsewhere)."""
        if tuple(x.shape[1:]) != self.in_shape:
            raise UserError(f"inputs must have shape [n, {', '.join(map(str, self.in_shape))}],"
                            f" got {list(x.shape)}")
        batch_size = batch_size or self._batch_size()
        chunk = batch_size
        if self._maps:  # the fixed maps run on chunks of whole batches (small calls are slow)
            chunk *= max(1, table_rows(self.in_shape) // batch_size)
        with torch.no_grad(), progress_bar(desc or "", len(x), "row", every=10.0,
                                           silent=desc is None) as bar:
            for i in range(0, len(x), chunk):
                rows = self.inputs(torch.as_tensor(np.ascontiguousarray(x[i:i + chunk]),
                                                   dtype=torch.float32, device=self.device))
                for j in range(0, len(rows), batch_size):
                    xb = rows[j:j + batch_size]
                    yield torch.cat([self._forward(p, xb) for p in self._groups(batch_size)])
                    bar.update(len(xb))

    def labels(self, x: np.ndarray, batch_size: int | None = None, desc: str | None = None
               ) -> Iterator[torch.Tensor]:
        """For each batch of rows of ``x``, the labels ``[num_teachers, b]`` of every teacher
        (:meth:`logits`)."""
        return (out.argmax(-1) for out in self.logits(x, batch_size, desc))

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
        return self.scores(x, y, batch_size, desc)[0]

    def scores(self, x: np.ndarray, y: np.ndarray, batch_size: int | None = None,
               desc: str | None = None) -> tuple[np.ndarray, float]:
        """Each teacher's accuracy ``[num_teachers]`` on the labelled rows ``(x, y)``, and the
        accuracy of the ensemble's plurality vote (ties to the lowest class, as ``argmax``), from
        one pass over the rows."""
        hits = torch.zeros(self.num_teachers, dtype=torch.int64, device=self.device)
        plurality_hits = 0
        yt = torch.as_tensor(y, device=self.device)
        start = 0
        for lab in self.labels(x, batch_size, desc):
            truth = yt[start:start + lab.shape[1]]
            hits += (lab == truth).sum(1)
            votes = torch.nn.functional.one_hot(lab, self.num_classes).sum(0)
            plurality_hits += int((votes.argmax(1) == truth).sum())
            start += lab.shape[1]
        return (hits.double() / len(y)).cpu().numpy(), plurality_hits / max(1, len(y))


def load_ensemble(run_dir: str | Path, device: str = "cpu", partial: bool = False) -> Ensemble:
    """The teachers of ``run_dir`` (all shards must be trained, or with ``partial`` those
    trained so far: a benchmark's), ready to vote on ``device``."""
    manifest = TeachersManifest.trained(run_dir, partial)
    shards = [checkpoints.load_shard(Path(run_dir), s.index, s.sha256, device)
              for s in manifest.shards]
    sha256 = manifest.pool_encoder_sha256
    encoder = None if sha256 is None else checkpoints.load_encoder(Path(run_dir), sha256, device)
    if is_import_path(manifest.model):  # a user's network: the one its teachers trained
        check_same_network(manifest.model, manifest.record.get("model_signature"),
                           build_user_model(manifest.model, manifest.in_shape,
                                            manifest.num_classes), "the run's teachers")
    return Ensemble(manifest.model, manifest.in_shape, manifest.num_classes, shards, device,
                    encoder)


def collect_votes(run_dir: str | Path, device: str = "cpu", data_dir: str | None = None,
                  batch_size: int | None = None) -> int:
    """Write ``votes.npz`` (private: votes int32 [queries, classes], pool_index int64, the
    public ``pool_fingerprint`` of the pool they were cast on, the number of private records
    and the private rows' fingerprint) for the public pool of
    ``run_dir`` and put the teachers' accuracy and their plurality's on the evaluation half,
    and the plurality's accuracy on the pool, into the manifest. Returns the number of
    queries."""
    if batch_size is not None and batch_size < 1:
        raise UserError(f"the batch size must be >= 1, got {batch_size}")
    run_dir = Path(run_dir)
    ens = load_ensemble(run_dir, device)
    record = checkpoints.read_manifest(run_dir)
    assert record is not None  # load_ensemble read it
    manifest = TeachersManifest(record)
    task = load_task(manifest.data_source(data_dir), need_private=False)
    if manifest.pool_changed(task):
        raise UserError("the public pool is not the one the teachers were trained beside (its "
                        "content, rows or label set changed since): its votes would not be "
                        "theirs; restore it, or train the teachers again in a new --run")
    with named_by_class("the teachers' votes"):  # the weights are private
        votes = ens.vote(task.pool_x, batch_size, desc="votes on the pool")
    # travel with the votes: the delta's bound, and which data their ledgers charge
    records = RunDir(run_dir).private_records()
    # the registry's key: the data as given (an older version's run: its rows as read), and
    # the rows' key beside it, under which older versions entered the same data's ledgers
    private, former = manifest.data_fingerprint, manifest.former_data_fingerprint
    rows = manifest.rows_fingerprint  # its rows in any format: a second key
    encoded = manifest.encoded_rows_fingerprint  # and as encoded, where that differs: a third
    by = manifest.partition  # what the analysis covers (public setting)
    write_with_atomic(RunDir(run_dir).votes, lambda fh: np.savez(
        fh, votes=votes, pool_index=np.arange(len(task.pool_x), dtype=np.int64),
        pool_fingerprint=np.array(task.pool_fingerprint), partition=np.array(by),
        **({} if records is None else {"private_records": np.array(records, np.int64)}),
        **({} if private is None else {"private_fingerprint": np.array(private)}),
        **({} if former is None else {"former_private_fingerprint": np.array(former)}),
        **({} if rows is None else {"private_rows_fingerprint": np.array(rows)}),
        **({} if encoded is None else {"private_encoded_rows_fingerprint": np.array(encoded)})),
        private=True)
    accuracy: dict = {"split": None if task.eval_y is None else "evaluation"}
    if task.eval_x is not None and task.eval_y is not None:
        with named_by_class("the teachers' accuracy"):
            acc, plurality = ens.scores(task.eval_x, task.eval_y, batch_size,
                                        desc="teacher accuracy")
        accuracy.update({"rows": len(task.eval_y), "plurality": plurality,
                         "mean": float(acc.mean()),
                         "min": float(acc.min()), "max": float(acc.max()),
                         "per_teacher": acc.round(5).tolist()})
    if task.pool_y is not None:  # a benchmark's pool labels (a user's are never read)
        accuracy["pool_plurality"] = float((votes.argmax(1) == task.pool_y).mean())
    checkpoints.write_manifest(run_dir, {**record, "accuracy": accuracy})
    return len(votes)
