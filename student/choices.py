"""The student's options described as data, importable without torch (the CLI and the config
read them at start; ``student.models.build_classifier`` builds the networks, the learners of
``student.training`` the methods, ``student.dpsgd.dpsgd_network`` DP-SGD's networks)."""

from __future__ import annotations

from dataclasses import dataclass

from teachers.choices import ANY_SIDE, HOG_SIDE, MinSide


@dataclass(frozen=True)
class Architecture:
    """What the code needs to know of a built-in student network: whether it is made for images
    only, whether its linear expert reads the pool encoder's features (``PoolFeatures``), and
    which expert of an ``Experts`` network VAT's smoothness is for (None: the whole network),
    and the smallest image side it takes."""

    images_only: bool
    pool_features: bool = False
    smoothed_expert: int | None = None
    min_side: MinSide = ANY_SIDE


@dataclass(frozen=True)
class Method:
    """A student method: its network unless another is named, Adam's learning rate unless
    another is given, the one network it must use and what that network is to it (None: any
    network), and why it is for images only (None: it is not)."""

    default_arch: str
    lr: float
    only_arch: str | None = None
    only_arch_is: str = ""
    images_only: str | None = None


ARCHITECTURE_RECORDS: dict[str, Architecture] = {
    "cnn": Architecture(images_only=True, min_side=MinSide(4, "Conv-Small's two 2x2 max-pools")),
    "cnn-hog": Architecture(images_only=True, smoothed_expert=0, min_side=HOG_SIDE),
    "cnn-hog-scatter": Architecture(images_only=True, smoothed_expert=0, min_side=HOG_SIDE),
    "cnn-hog-simclr": Architecture(images_only=True, pool_features=True, smoothed_expert=0,
                                   min_side=HOG_SIDE),
    "mlp": Architecture(images_only=False),
    "wn-mlp": Architecture(images_only=False),
}
ARCHITECTURES: tuple[str, ...] = tuple(ARCHITECTURE_RECORDS)
# The architectures whose linear expert reads PoolFeatures.
POOL_FEATURE_ARCHS = frozenset(n for n, a in ARCHITECTURE_RECORDS.items() if a.pool_features)

# Adam's rates: the VAT paper's; the GAN's, Salimans et al.'s released code.
METHOD_RECORDS: dict[str, Method] = {
    "vat": Method(default_arch="cnn", lr=1e-3),
    "supervised": Method(default_arch="cnn", lr=1e-3),
    "gan": Method(default_arch="wn-mlp", lr=3e-3, only_arch="wn-mlp",
                  only_arch_is="its own discriminator",
                  images_only="the improved-GAN student generates images"),
}
METHODS: tuple[str, ...] = tuple(METHOD_RECORDS)
SELECTIONS: tuple[str, ...] = ("first", "random", "uncertainty")


def arch_method_problem(method: str, arch: str | None) -> str | None:
    """Why ``arch`` cannot be ``method``'s network (None where it can, or is not named)."""
    record = METHOD_RECORDS[method]
    if arch is None or record.only_arch is None or arch == record.only_arch:
        return None
    return (f"method {method}: the student's network is {record.only_arch_is}, arch "
            f"{record.only_arch}; another arch works with "
            f"{' or '.join(m for m, r in METHOD_RECORDS.items() if r.only_arch is None)}")


def methods_for_tables() -> str:
    """The methods that learn from tabular data, as a sentence says them."""
    return " or ".join(m for m, r in METHOD_RECORDS.items() if r.images_only is None)


# DP-SGD's networks (student.dpsgd.dpsgd_network), and whether each is for images only:
# Papernot et al.'s tempered-sigmoid CNN, a linear softmax on fixed wavelet scattering features
# (Tramer & Boneh's) or on fixed HOG features (the ``hog`` teachers' network), or a linear
# softmax on the inputs themselves (any data; tabular data's default).
DPSGD_IMAGES_ONLY: dict[str, bool] = {"tempered-cnn": True, "scatter-linear": True,
                                      "hog-linear": True, "linear": False}
DPSGD_MODELS: tuple[str, ...] = tuple(DPSGD_IMAGES_ONLY)
DEFAULT_DPSGD_MODEL: dict[str, str] = {"image": "tempered-cnn", "tabular": "linear"}
# Parameters of the default network on Fashion-MNIST, tempered_cnn((1, 28, 28), 10): the
# gradient's dimension that ``pate epsilon dpsgd``'s encoded accounting defaults to (a test
# checks it against the network).
DEFAULT_CNN_PARAMETERS = 26010


def dpsgd_model_for(name: str | None, kind: str) -> str:
    """DP-SGD's network for ``kind`` data (``image`` or ``tabular``): ``name``, else the kind's
    default; ``ValueError`` for one that cannot learn from it."""
    name = name or DEFAULT_DPSGD_MODEL[kind]
    if kind == "tabular" and DPSGD_IMAGES_ONLY.get(name, False):
        raise ValueError(f"model {name!r} is for images; DP-SGD on feature rows takes "
                         f"{DEFAULT_DPSGD_MODEL['tabular']!r}")
    return name
