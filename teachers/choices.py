"""Names of the teachers' architectures, importable without torch (the CLI registers them at
start); ``teachers.models.ARCHITECTURES`` builds them. A user's own network is named by its
import path instead (:mod:`teachers.user_models`); :func:`model_name_problem` tells the two
forms apart without importing anything."""

import re

MODELS: tuple[str, ...] = ("cnn", "cnn-pool", "resnet", "mlp", "hog", "cnn-pool-hog",
                          "cnn-pool-hog-simclr")
# The model a run's teachers get when none is named, by the kind of data (pate.data.task).
DEFAULT_MODEL: dict[str, str] = {"image": "cnn", "tabular": "mlp"}
# The built-ins that take feature rows; the others are made for images.
TABULAR_MODELS: frozenset[str] = frozenset({"mlp"})


def model_data_problem(name: str, kind: str) -> str | None:
    """Why built-in model ``name`` cannot learn from ``kind`` data (``image`` or ``tabular``),
    or None (a user's network is checked when it is built)."""
    if kind == "tabular" and name in MODELS and name not in TABULAR_MODELS:
        return f"model {name} needs images; on tabular data use mlp"
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
