"""Names of the student's options, importable without torch (the CLI registers them at start)."""

ARCHITECTURES: tuple[str, ...] = ("cnn", "cnn-hog", "cnn-hog-simclr", "mlp", "wn-mlp")
METHODS: tuple[str, ...] = ("vat", "gan", "supervised")
SELECTIONS: tuple[str, ...] = ("first", "random", "uncertainty")
# DP-SGD's networks (student.dpsgd.dpsgd_network): Papernot et al.'s tempered-sigmoid CNN, a
# linear softmax on fixed wavelet scattering features (Tramer & Boneh's), or on fixed HOG
# features (the ``hog`` teachers' network), all for images, or a linear softmax on the inputs
# themselves (any data; tabular data's default).
DPSGD_MODELS: tuple[str, ...] = ("tempered-cnn", "scatter-linear", "hog-linear", "linear")
DEFAULT_DPSGD_MODEL: dict[str, str] = {"image": "tempered-cnn", "tabular": "linear"}
_IMAGE_ONLY_DPSGD = frozenset({"tempered-cnn", "scatter-linear", "hog-linear"})


def dpsgd_model_for(name: str | None, kind: str) -> str:
    """DP-SGD's network for ``kind`` data (``image`` or ``tabular``): ``name``, else the kind's
    default; ``ValueError`` for one that cannot learn from it."""
    name = name or DEFAULT_DPSGD_MODEL[kind]
    if kind == "tabular" and name in _IMAGE_ONLY_DPSGD:
        raise ValueError(f"model {name!r} is for images; DP-SGD on feature rows takes "
                         f"{DEFAULT_DPSGD_MODEL['tabular']!r}")
    return name
