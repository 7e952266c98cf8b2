"""The label set of a user's files, and their labels as indices into it.

The label set is schema, treated as public: ``classes`` from the config, else the labels of the
test file, else the class subfolders of an image folder; a private label outside it is an error
that names no private value.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pate.data import files
from pate.errors import UserError

MANY_NUMBER_CLASSES = 20  # more classes than this, all numbers: perhaps a numeric column


def label_set(classes: tuple[str, ...] | None, label: str | None, private: str,
              test_labels: NDArray | None) -> tuple[tuple[str, ...], str]:
    """The label set and where it came from (a key of ``SET_FROM``): the config's ``classes``,
    else the ``test_labels`` (a CSV's ``label`` column), else the class subfolders of the
    ``private`` folder of images."""
    if classes:
        return tuple(str(c) for c in classes), "config"
    if test_labels is not None:
        found = tuple(sorted({str(v) for v in test_labels.tolist()}))
        if len(found) > MANY_NUMBER_CLASSES and pd.to_numeric(
                pd.Series(found), errors="coerce").notna().all():
            # a numeric column taken for the label: every value a class, and a run would
            # spend its budget on queries no teachers' majority answers (fail closed)
            raise UserError(f"the test labels{f' ({label})' if label else ''} "
                            f"hold {len(found)} distinct numbers, each would be a class: if "
                            "that is not the label you meant, give data.label (--label); if it "
                            "is, give the label set as data.classes (--classes)")
        return found, "test"
    if files.kind_of(private) == "folder":
        return tuple(files.image_folder_classes(private)), "folders"
    raise UserError("the label set is unknown: give data.classes (--classes) or labelled test "
                    "data (the label set is public schema, never read from the private labels)")


# where the label set came from, as an error about the private labels says it
SET_FROM = {"config": "data.classes", "test": "the test data's labels",
            "folders": "the private folder's class subfolders"}


def encode_labels(y: NDArray, classes: tuple[str, ...], indices: bool, what: str,
                   private: bool, set_from: str = "") -> NDArray[np.int64]:
    """Labels as indices into ``classes``: integer labels are indices themselves when the set
    came from the config (``indices``), otherwise every label is matched by its name;
    ``set_from`` says where the set came from, in the refusal of private labels outside it."""
    if not (np.issubdtype(y.dtype, np.integer) or y.dtype.kind in "OUS"):
        raise UserError(f"{what}: labels must be integers or strings, got dtype {y.dtype}")
    positions = indices and np.issubdtype(y.dtype, np.integer)
    if positions:
        codes = y.astype(np.int64)
        outside = (codes < 0) | (codes >= len(classes))
        numbers = [int(c) for c in classes if c.lstrip("-").isdigit()]
        if len(numbers) == len(classes) and numbers != list(range(len(classes))):
            warnings.warn(f"{what}: data.classes are numbers ({', '.join(classes[:5])}"
                          f"{', ...' if len(classes) > 5 else ''}) and the labels integers: a "
                          f"label is a position in data.classes (label 0 is class "
                          f"{classes[0]!r}), not a class's name; list the classes in the order "
                          "of the labels' numbers", stacklevel=4)
    else:
        codes = pd.Index(classes).get_indexer(pd.Series(y).astype(str)).astype(np.int64)
        outside = codes < 0
    if outside.any():
        as_positions = (f"integer labels are positions in data.classes, 0 to "
                        f"{len(classes) - 1}" if positions else "")
        if private:  # name no private value, nor how many there are, nor read them for a hint
            decimals = ("; if they are written as decimals (1.0 for 1), write them as the label "
                        "set does" if y.dtype.kind in "OUS" and _whole_numbers(classes) else "")
            raise UserError(f"{what}: labels outside the label set ({', '.join(classes[:10])}"
                            f"{', ...' if len(classes) > 10 else ''}; from {set_from}"
                            f"{'; ' + as_positions if positions else ''}{decimals}): give "
                            "data.classes (--classes) that hold them all, or mend the data")
        decimals = ("; the labels are written as decimals (as 1.0 for 1): write them as the "
                    "label set does" if _written_as_decimals(y[outside], classes) else "")
        unknown = sorted({str(v) for v in np.asarray(y)[outside].tolist()})[:5]
        raise UserError(f"{what}: label(s) unknown to the label set: {', '.join(unknown)}"
                        + (f" ({as_positions})" if positions else "") + decimals)
    return codes


def _whole_numbers(classes: tuple[str, ...]) -> bool:
    """Whether every class of the set is named by a whole number ("3", "-1")."""
    return all(c.lstrip("-").isdigit() for c in classes)


def _written_as_decimals(labels: NDArray, classes: tuple[str, ...]) -> bool:
    """Whether text ``labels`` outside the set are whole numbers written with decimals
    ("3.0"), and the set's names are whole numbers ("3"): a CSV written from floats."""
    if labels.dtype.kind not in "OUS" or not _whole_numbers(classes):
        return False
    text = pd.Series(labels).astype(str)
    numbers = pd.to_numeric(text, errors="coerce")
    return bool(text.str.contains(".", regex=False).all() and numbers.notna().all()
                and (numbers == numbers.round()).all())
