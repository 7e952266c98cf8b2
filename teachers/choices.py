"""The teachers' architectures described as data, importable without torch (the CLI registers
them at start); ``teachers.models.ARCHITECTURES`` builds them. A user's own network is named by
its import path instead (:mod:`teachers.user_models`); :func:`model_name_problem` tells the two
forms apart without importing anything."""

import re
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MinSide:
    """The smallest image side a network takes, and what sets it (the teachers', the
    student's and DP-SGD's networks)."""

    side: int = 1
    why: str = ""

    def problem(self, what: str, image_shape: tuple[int, ...]) -> str | None:
        """Why ``what`` cannot take images ``[C, H, W]`` of ``image_shape``, or None."""
        if min(image_shape[1:]) >= self.side:
            return None
        return (f"{what} needs images of at least {self.side}x{self.side} pixels"
                + (f" ({self.why})" if self.why else "")
                + f", got {'x'.join(map(str, image_shape[1:]))}")


# HOG needs two cells of 4 pixels a side (its blocks are 2x2 cells); order-2 scattering at J = 2
# scales, a side of 2^J; two 2x2 max-pools, a side of 4.
ANY_SIDE = MinSide()
HOG_SIDE = MinSide(8, "HOG's blocks of 2x2 cells of 4 pixels")
SCATTERING_SIDE = MinSide(4, "scattering at 2 scales")
_POOLS = MinSide(4, "two 2x2 max-pools")


# The kinds of frozen pool encoder a built-in network may read (a run's manifest names its kind).
SIMCLR, WHITENING = "simclr", "whitening"
PoolEncoderKind = Literal["simclr", "whitening"]


@dataclass(frozen=True)
class TeacherModel:
    """What the code needs to know of a built-in teachers' network: whether it is made for
    images only, the smallest image side it takes, and which frozen pool encoder it reads, if
    any: a map fitted on the public pool before the teachers train, once per run, and shared by
    all of them (``simclr``: :mod:`teachers.pool_encoder`; ``whitening``:
    :mod:`teachers.whitening`)."""

    images_only: bool
    pool_encoder: PoolEncoderKind | None = None
    min_side: MinSide = ANY_SIDE


MODEL_RECORDS: dict[str, TeacherModel] = {
    "cnn": TeacherModel(images_only=True), "cnn-pool": TeacherModel(True, min_side=_POOLS),
    "resnet": TeacherModel(images_only=True), "mlp": TeacherModel(images_only=False),
    "hog": TeacherModel(True, min_side=HOG_SIDE),
    "scatter": TeacherModel(True, min_side=SCATTERING_SIDE),
    "hog-scatter": TeacherModel(True, min_side=HOG_SIDE),
    "hog-scatter-whitened": TeacherModel(True, pool_encoder=WHITENING, min_side=HOG_SIDE),
    "cnn-pool-hog": TeacherModel(True, min_side=HOG_SIDE),
    "cnn-pool-hog-simclr": TeacherModel(True, pool_encoder=SIMCLR, min_side=HOG_SIDE)}
MODELS: tuple[str, ...] = tuple(MODEL_RECORDS)
POOL_ENCODER_MODELS = frozenset(n for n, m in MODEL_RECORDS.items() if m.pool_encoder)
# The model a run's teachers get when none is named, by the kind of data (pate.data.task).
DEFAULT_MODEL: dict[str, str] = {"image": "cnn", "tabular": "mlp"}


def model_data_problem(name: str, kind: str, in_shape: tuple[int, ...]) -> str | None:
    """Why built-in model ``name`` cannot learn from ``kind`` data (``image`` or ``tabular``)
    of rows ``in_shape`` (images ``[C, H, W]``), or None (a user's network is checked when it
    is built)."""
    record = MODEL_RECORDS.get(name)
    if record is None:
        return None
    if kind == "tabular" and record.images_only:
        return f"model {name} needs images; on tabular data use {DEFAULT_MODEL['tabular']}"
    if kind == "image":
        return record.min_side.problem(f"model {name}", in_shape)
    return None


# ``package.module:factory`` (the attribute may be dotted: ``module:Class.build``).
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def is_import_path(name: str) -> bool:
    """Whether ``name`` has the form ``package.module:factory``."""
    return _IMPORT_PATH.fullmatch(name) is not None


def model_name_problem(name: str, builtins: tuple[str, ...]) -> str | None:
    """Why ``name`` is neither one of ``builtins`` nor an import path, or None when it is."""
    if name in builtins or is_import_path(name):
        return None
    return (f"{name!r} is neither one of {', '.join(builtins)} nor an import path "
            "package.module:factory")


def gpu_share_problem(share: float) -> str | None:
    """Why ``share`` cannot be the GPUs one shard asks Ray for, or None: a share of one GPU in
    (0, 1], or a whole number of them (Ray takes no 1.5 GPUs)."""
    if not 0 < share < float("inf"):
        return f"must be a number > 0 (a GPU's share), got {share}"
    if share > 1 and not float(share).is_integer():
        return f"must be a share of one GPU (at most 1) or a whole number of GPUs, got {share:g}"
    return None


def ray_address_problem(address: str | None) -> str | None:
    """Why ``address`` cannot name a Ray cluster to join, or None (None itself: a local Ray).
    An empty one would be taken for none, and a private local Ray started unasked."""
    if address is not None and not address.strip():
        return ("is empty: give a cluster's address (HOST:PORT, ray://HOST:PORT or auto), or "
                "leave it out for a Ray of this machine's own")
    return None
