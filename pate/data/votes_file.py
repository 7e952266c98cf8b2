"""Reading and validating votes matrices (``votes.npz`` of a run, or a published ``.npy``)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from pate.data.partitions import PARTITIONS
from pate.errors import UserError

MAX_COUNT = 2**31 - 1  # a count above it is no number of teachers, and its sum could overflow
# what reading a damaged .npy or .npz raises (np.load, or a member read out of the archive)
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile)


def _load_array(path: Path, key: str, not_with: str | None = None) -> NDArray:
    """The array ``key`` of an ``.npz`` (or its one unnamed array), or a ``.npy``'s; an
    ``.npz`` that holds ``not_with`` too is another kind of file, refused."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            return data
        with data:
            names = list(data.files)
            if not_with in names:
                raise UserError(f"{path}: a file of {not_with} (it holds {not_with!r}), not "
                                f"one of {key} alone")
            if key in names:
                return data[key]
            if names == ["arr_0"]:  # np.savez(path, array): an unnamed array
                return data["arr_0"]
            raise UserError(f"{path}: expected an array named {key!r}, found {names}")
    except READ_ERRORS as exc:
        raise UserError(f"{path}: not a readable .npy/.npz file "
                        f"({exc.__class__.__name__})") from None


def load_votes(path: str | Path) -> NDArray[np.int64]:
    """Votes ``[queries, classes]`` of a file, checked by ``check_votes`` (PATE 2018's analysis
    scripts read the same format)."""
    return check_votes(_load_array(Path(path), "votes"), str(path))


def check_votes(votes: NDArray, what: str = "votes") -> NDArray[np.int64]:
    """Votes ``[queries, classes]`` as int64: finite, non-negative integers, every row summing
    to the same number of teachers; ``UserError`` naming ``what`` otherwise."""
    votes = np.asarray(votes)
    if votes.ndim != 2 or votes.shape[0] == 0 or votes.shape[1] < 2:
        raise UserError(f"{what}: votes must be a 2-d array [queries >= 1, classes >= 2], "
                        f"got shape {list(votes.shape)}")
    if not np.issubdtype(votes.dtype, np.number) or np.issubdtype(votes.dtype, np.complexfloating):
        raise UserError(f"{what}: votes must be numeric, got dtype {votes.dtype}")
    if not np.all(np.isfinite(votes)):
        raise UserError(f"{what}: votes contain NaN or infinite values")
    if np.any(votes < 0):
        raise UserError(f"{what}: votes must be non-negative counts")
    if np.any(votes != np.round(votes)):
        raise UserError(f"{what}: votes must be integer counts")
    if np.any(votes > MAX_COUNT):
        raise UserError(f"{what}: votes must be counts of at most {MAX_COUNT} teachers")
    votes = votes.astype(np.int64)
    totals = votes.sum(axis=1)
    if np.any(totals != totals[0]):  # the sums are not quoted: in a bad file they may be votes
        raise UserError(f"{what}: every row must sum to the same number of teachers")
    if totals[0] == 0:
        raise UserError(f"{what}: rows sum to 0: there are no teachers' votes")
    return votes


def load_votes_with_index(path: str | Path) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Votes (``load_votes``) and the pool index of each row: a run's ``votes.npz`` holds it as
    ``pool_index``; a file without one covers the pool rows ``0..rows-1``."""
    votes = load_votes(path)
    index = np.arange(len(votes), dtype=np.int64)
    if str(path).endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as data:
                if "pool_index" in data.files:
                    index = data["pool_index"]
        except READ_ERRORS as exc:
            raise UserError(f"{path}: not a readable .npz file ({exc.__class__.__name__})"
                            ) from None
        if not np.issubdtype(index.dtype, np.integer):
            raise UserError(f"{path}: pool_index must be integers")
        if index.shape != (len(votes),):
            raise UserError(f"{path}: pool_index must be 1-d with one entry per votes row, got "
                            f"shape {list(index.shape)}")
    return votes, index.astype(np.int64)


def load_pool_fingerprint(path: str | Path) -> str | None:
    """The ``pool_fingerprint`` an ``.npz`` of a run records (``Task.pool_fingerprint`` of the
    pool its ``votes.npz`` was cast on, or its ``labels.npz`` asked about); None for a file
    without one (a published ``.npy``, an older version's file)."""
    value = _npz_member(path, "pool_fingerprint")
    if value is None:
        return None
    if value.shape != () or value.dtype.kind != "U" or not str(value):
        raise UserError(f"{path}: pool_fingerprint must be one non-empty string")
    return str(value)


def load_pool_indices(path: str | Path) -> NDArray[np.int64]:
    """Pool indices, 1-d integers: a ``.npy``, or an ``.npz`` with ``pool_index`` (a student's
    ``labels.npz``)."""
    indices = _load_array(Path(path), "pool_index", not_with="votes")  # not a votes file
    if indices.ndim != 1 or indices.size == 0:
        raise UserError(f"{path}: pool indices must be a non-empty 1-d array, got shape "
                        f"{list(indices.shape)}")
    if not np.issubdtype(indices.dtype, np.integer):
        raise UserError(f"{path}: pool indices must be integers, got dtype {indices.dtype}")
    return indices.astype(np.int64)


def load_baseline(path: str | Path, votes: NDArray[np.int64]) -> NDArray[np.float64]:
    """Interactive-GNMax baseline ``num_teachers * student_probs``, same shape as the votes."""
    baseline = _load_array(Path(path), "baseline")
    if baseline.shape != votes.shape:
        raise UserError(f"{path}: baseline shape {list(baseline.shape)} differs from the votes' "
                        f"{list(votes.shape)}")
    if not (np.issubdtype(baseline.dtype, np.integer)
            or np.issubdtype(baseline.dtype, np.floating)):  # not text, nor complex
        raise UserError(f"{path}: baseline must be real numbers, got dtype {baseline.dtype}")
    baseline = baseline.astype(np.float64)
    if not np.all(np.isfinite(baseline)) or np.any(baseline < 0):
        raise UserError(f"{path}: baseline must be finite and non-negative")
    teachers = float(votes[0].sum())
    if not np.allclose(baseline.sum(axis=1), teachers, rtol=1e-6, atol=1e-6 * teachers):
        raise UserError(f"{path}: every baseline row must sum to the number of teachers "
                        f"({teachers:g}): it is num_teachers * student probabilities")
    return baseline


def load_private_records(path: str | Path) -> int | None:
    """The number of private records the votes' teachers learnt from, as a run's ``votes.npz``
    records it (``private_records``: it sets the delta the votes may be charged at, wherever
    they are copied); None for a file without it (a published ``.npy``, an older version's)."""
    value = _npz_member(path, "private_records")
    if value is None:
        return None
    if (value.shape != () or not np.issubdtype(value.dtype, np.integer)
            or int(value) < 1):
        raise UserError(f"{path}: private_records must be one integer >= 1")
    return int(value)


def load_partition(path: str | Path) -> str:
    """How the votes' teachers were dealt their rows (``pate.data.partitions.PARTITIONS``), as a
    run's ``votes.npz`` records it (``partition``): it says which neighbouring datasets the
    analysis covers. ``position`` for a file without it (a published ``.npy``, an older
    version's)."""
    value = _npz_member(path, "partition")
    if value is None:
        return "position"
    if value.shape != () or str(value) not in PARTITIONS:
        raise UserError(f"{path}: partition must be one of {', '.join(PARTITIONS)}")
    return str(value)


def load_private_fingerprint(path: str | Path, member: str = "private_fingerprint"
                             ) -> str | None:
    """The fingerprint of the private data the votes' teachers learnt from, as a run's
    ``votes.npz`` records it (``Task.private_data_fingerprint``; an older version's, of the rows
    as read, ``Task.private_fingerprint``; PRIVATE: which ledgers charge the same data,
    ``pate.aggregation.budget_registry``); None for a file without it. ``member``
    ``former_private_fingerprint``: the rows' one beside it, the key older versions entered
    their ledgers under; ``private_rows_fingerprint``: the rows' in any order and format
    (``Task.private_rows_fingerprint``), the second key of the data's ledgers;
    ``private_encoded_rows_fingerprint``: the rows' as encoded, where the second is of them as
    read before (``Task.private_encoded_rows_fingerprint``), the third."""
    value = _npz_member(path, member)
    if value is None:
        return None
    if (value.shape != () or value.dtype.kind != "U"
            or re.fullmatch("[0-9a-f]{64}", str(value)) is None):
        raise UserError(f"{path}: {member} must be one sha256 in hex")
    return str(value)


# the members under which a votes file records the keys of its private data's ledgers: the data
# as given, the rows' in order (older versions' key), the rows' in any order and format, and
# the rows' as encoded where that differs
PRIVATE_KEY_MEMBERS = ("private_fingerprint", "former_private_fingerprint",
                       "private_rows_fingerprint", "private_encoded_rows_fingerprint")


def load_private_keys(path: str | Path) -> tuple[str | None, ...]:
    """Every key of the ledgers of the votes' private data (``PRIVATE_KEY_MEMBERS``, each as
    :func:`load_private_fingerprint` reads it; None where absent). PRIVATE."""
    return tuple(load_private_fingerprint(path, member) for member in PRIVATE_KEY_MEMBERS)


def _npz_member(path: str | Path, key: str) -> NDArray | None:
    """The member ``key`` of the ``.npz`` at ``path``, None where it holds none (or is not an
    ``.npz``); one ``UserError`` where the file or the member cannot be read (a damaged
    file)."""
    if not str(path).endswith(".npz"):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return data[key] if key in data.files else None
    except PermissionError:
        raise UserError(f"{path}: not readable by you (its permissions)") from None
    except READ_ERRORS as exc:
        raise UserError(f"{path}: its {key} cannot be read ({exc.__class__.__name__}: a "
                        "damaged file)") from None
