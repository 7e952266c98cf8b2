"""PATE: Private Aggregation of Teacher Ensembles (Papernot et al. 2017, 2018)."""

import importlib.util
from pathlib import Path

__version__ = "0.1.0"

# The layers installed beside ``pate`` as top-level packages (docs/design.md, "Layers").
SIBLING_PACKAGES = ("analysis", "teachers", "student")


def _check_siblings() -> None:
    """Refuse, on import, a module of one of ``SIBLING_PACKAGES``' names found before this
    project's (a ``student.py`` in the folder a script or ``python -c`` runs from, which Python
    searches first): it would be imported in their place and fail far from here, or worse.
    Nothing is imported to tell: a folder without ``__init__.py`` (a namespace, such as the
    test suite's ``tests/student``) leaves the name to the installed package."""
    home = Path(__file__).resolve().parent.parent
    for name in SIBLING_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is None:  # a namespace: ours is found through it
            continue
        if spec is None:
            raise ImportError(f"pate: the package {name!r} is not installed beside pate: "
                              "reinstall the project")
        if Path(spec.origin).resolve().parent.parent != home:
            raise ImportError(f"pate: the package {name!r} installed beside pate is shadowed by "
                              f"{spec.origin}: rename that, or work from another folder")


_check_siblings()
