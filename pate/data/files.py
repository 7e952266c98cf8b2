"""Reading a user's data files as they are: ``.npz`` arrays, ``.csv`` tables and folders of
images. Nothing here learns anything from the data; ``pate.data.task`` turns what is read into a
task, with preprocessing fitted on the public data only.

- ``.npz``: an array ``x`` (features ``[n, d]`` or images ``[n, H, W]`` / ``[n, C, H, W]``) and,
  where labels are needed, ``y`` (integers or strings).
- ``.csv``: a header row; numeric and string columns; ``?``, ``NA`` or an empty field is a missing
  value; the label column is named by the config (``label``).
- a folder: PNG or JPEG images in one subfolder per class (the folder's name is the class), or,
  for the unlabelled public pool, images directly in the folder.

Every mistake is one ``UserError`` line naming the file, never a value of a private file nor
a place in it (``place``).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pate.errors import UserError

if TYPE_CHECKING:
    from PIL import Image

# A CSV field that says "missing" (after its surrounding spaces are removed): these and no
# other word (pandas' own longer list is not used), so a category's value is never lost to it.
MISSING_VALUES = ("", "?", "NA", "N/A", "n/a", "#N/A", "NaN", "nan", "null", "NULL", "None")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
HIDDEN_PLACE = "places in private data are not shown"


def place(kind: str, number: int, private: bool) -> str:
    """How an error names a ``line`` or ``row`` of a file: ``line 7`` in a public or test file,
    ``a line (HIDDEN_PLACE)`` in a private one. A place in private data is private: the last
    row's number is the count of records, private where the teachers are dealt by record or
    key, and an error line may reach logs that the data's holder does not keep to themself."""
    return f"a {kind} ({HIDDEN_PLACE})" if private else f"{kind} {number}"


def kind_named(path: str | Path) -> str:
    """The format a path names, without looking at it: ``npz`` or ``csv`` by its suffix, else
    ``folder``."""
    suffix = Path(path).suffix.lower()
    return suffix[1:] if suffix in (".npz", ".csv") else "folder"


def kind_of(path: str | Path) -> str:
    """``npz``, ``csv`` or ``folder``: the format of an existing path (``kind_named``)."""
    p = Path(path)
    _exists(p)
    if p.is_dir():
        return "folder"
    kind = kind_named(p)
    if kind == "folder":
        raise UserError(f"{p}: a data file is a .npz, a .csv or a folder of images")
    return kind


def _exists(path: Path) -> None:
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")


def read_npz(path: str | Path, need_labels: bool, private: bool = False
             ) -> tuple[NDArray, NDArray | None]:
    """``x`` and (if ``need_labels``, required; else ``None``) ``y`` of an ``.npz``. Errors
    about a ``private`` file count no rows (``rows_said``)."""
    p = Path(path)
    _exists(p)
    try:
        with np.load(p, allow_pickle=False) as data:
            names = list(data.files)
            if "x" not in names:
                raise UserError(f"{p}: expected an array named 'x', found {names}")
            if need_labels and "y" not in names:
                raise UserError(f"{p}: expected the labels as an array named 'y', found {names}")
            x = data["x"]
            y = data["y"] if need_labels else None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserError(f"{p}: not a readable .npz file ({exc.__class__.__name__})") from None
    if x.ndim not in (2, 3, 4) or x.shape[0] == 0 or 0 in x.shape:
        raise UserError(f"{p}: x must be [n, d] features or [n, H, W] / [n, C, H, W] images "
                        f"with n > 0, got {shape_said(x.shape, private)}")
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise UserError(f"{p}: x must be numeric, got dtype {x.dtype}")
    if y is not None and y.shape != (x.shape[0],):
        got = (f"{y.ndim} dimensions" if y.ndim != 1 else
               rows_said(len(y), x.shape[0], "labels", private))
        raise UserError(f"{p}: y must be 1-d with one label per row of x, got {got}")
    return x, y


def shape_said(shape: tuple[int, ...], private: bool) -> str:
    """An array's shape as an error says it: whole, or for ``private`` rows without their
    number (``[n, 28, 28]``; an empty one says so), which is private where the teachers are
    dealt by record or key."""
    if not private:
        return f"shape {list(shape)}"
    if shape and shape[0] == 0:
        return "no rows"
    return f"shape [{', '.join(['n', *(str(s) for s in shape[1:])])}]"


def rows_said(count: int, rows: int, what: str, private: bool) -> str:
    """``count`` of ``what`` (labels, keys) against ``rows`` rows, as an error says it: the
    numbers, or for ``private`` rows only which is the larger (``shape_said``)."""
    if not private:
        return f"{count} {what} for {rows} rows"
    return f"{'more' if count > rows else 'fewer'} {what} than rows"


def _check_field_counts(path: Path, raw: bytes, private: bool) -> None:
    """Refuse a CSV line with fewer or more comma-separated fields than its header, by line
    number in a public file (``place``). pandas fills a short row with missing values unsaid.
    Counted on the bytes at once; a file with quotes (where a comma or a line break may sit
    inside a value, and a quote inside an unquoted value is a plain character) is counted by
    ``_check_quoted_rows``."""
    data = np.frombuffer(raw, np.uint8)
    if not len(data):
        return
    data = _line_feeds_only(path, data, private)
    if (data == ord('"')).any():
        _check_quoted_rows(path, raw, private)
        return
    ends = np.flatnonzero(data == ord("\n"))
    if not len(ends) or ends[-1] != len(data) - 1:
        ends = np.append(ends, len(data))
    starts = np.concatenate([[0], ends[:-1] + 1])
    commas = np.concatenate([[0], np.cumsum(data == ord(","))])
    fields = commas[ends] - commas[starts] + 1
    carriage = (ends > starts) & (data[np.maximum(ends - 1, 0)] == ord("\r"))
    length = ends - starts - carriage
    lines = np.flatnonzero(length > 0)  # blank lines are skipped, as pandas does
    if len(lines) < 2:
        return
    # one comma too many at the end of a row is no field (pandas reads it so, index_col=False)
    trailing = data[np.maximum(starts + length - 1, 0)] == ord(",")
    header, rows = fields[lines[0]], lines[1:]
    wrong = rows[(fields[rows] != header) & ~(trailing[rows] & (fields[rows] == header + 1))]
    if len(wrong):
        line = place("line", int(wrong[0]) + 1, private)
        if fields[wrong[0]] > header:
            raise UserError(f"{path}: {line} has more fields than the header (a comma inside a "
                            "value needs quotes)")
        raise UserError(f"{path}: {line} has fewer fields than the header")


def _check_utf8(path: Path, raw: bytes) -> None:
    """Refuse a .csv that is not UTF-8 text, saying so (UTF-16 read as bytes would be taken
    for rows with too few fields)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        wide = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        raise UserError(f"{path}: not UTF-8 text{' (it is UTF-16)' if wide else ''}: save it "
                        "as UTF-8") from None


def _line_feeds_only(path: Path, data: np.ndarray, private: bool) -> np.ndarray:
    """The bytes with classic Mac line ends (a carriage return alone, in a file without line
    feeds) made line feeds, as pandas reads them. In a file of line feeds, a carriage return
    outside quotes followed by a field's byte (not a line end, another carriage return or the
    end of the file) is refused, by line: pandas would split the row there (one pasted from
    another file, say) and read two rows, each of them wrong, without a word."""
    carriage = data == ord("\r")
    if not carriage.any():
        return data
    feeds = data == ord("\n")
    if not feeds.any():
        return np.where(carriage, np.uint8(ord("\n")), data)
    following = np.append(data[1:], np.uint8(ord("\n")))  # the end of the file ends a line
    quoted = np.cumsum(data == ord('"')) % 2 == 1  # inside a quoted value (parity of quotes)
    stray = carriage & ~quoted & (following != ord("\n")) & (following != ord("\r"))
    if stray.any():
        line = place("line", int(feeds[:int(np.argmax(stray))].sum()) + 1, private)
        raise UserError(f"{path}: {line} holds a carriage return that ends no line (a "
                        "file of mixed line ends: it would be read as two rows); save it with "
                        "one kind of line end")
    return data


def _check_quoted_rows(path: Path, raw: bytes, private: bool) -> None:
    """``_check_field_counts`` for a file with quotes, by pandas' Python parser, the one that
    tells a field that is absent (a short row: missing) from one that is empty (``""``); the
    row is named by its number after the header (a quoted value may span lines; ``place``).
    A long row is refused by ``read_csv``'s own parse."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pd.errors.ParserWarning)  # a long row: said after
        try:
            rows = pd.read_csv(io.BytesIO(raw), dtype=str, na_filter=False, index_col=False,
                               engine="python")
        except (pd.errors.ParserError, ValueError, UnicodeDecodeError):
            return  # said by read_csv's own parse
    short = rows.isna().to_numpy().any(axis=1)
    if short.any():
        row = place("row", int(np.argmax(short)) + 1, private)
        raise UserError(f"{path}: {row}{'' if private else ' after the header'} has fewer "
                        "fields than the header")


def read_csv(path: str | Path, label: str | None, need_labels: bool, private: bool = False
             ) -> tuple[pd.DataFrame, NDArray | None]:
    """The feature columns, as text with surrounding spaces removed (``NaN`` where missing), and
    (if ``need_labels``) the ``label`` column of a ``.csv``: integers when every label is one,
    else text. Every file is read the same way, so a column's values do not change with what
    else a file holds (``01`` stays ``01``); ``pate.data.preprocessing`` decides which columns
    are numbers. A label column in a file that needs none (the public pool's) is dropped
    unread. Errors about a ``private`` file name no place in it (``place``)."""
    p = Path(path)
    _exists(p)
    if label is None:
        raise UserError(f"{p}: a .csv needs data.label (--label), the name of its label column")
    try:
        raw = p.read_bytes()  # read once: counted, then parsed
        _check_utf8(p, raw)
        _check_field_counts(p, raw, private)
        with warnings.catch_warnings():  # a row with more fields than the header: refused
            warnings.simplefilter("error", pd.errors.ParserWarning)
            header = pd.read_csv(io.BytesIO(raw), header=None, nrows=1, dtype=str,
                                 keep_default_na=False)
            frame = pd.read_csv(io.BytesIO(raw), dtype=str, na_values=list(MISSING_VALUES),
                                keep_default_na=False, skipinitialspace=True, index_col=False)
    except (pd.errors.ParserWarning, pd.errors.ParserError) as exc:
        found = re.search(r"line (\d+)", str(exc))
        line = "a row" if found is None else place("line", int(found[1]), private)
        raise UserError(f"{p}: {line} has more fields than the header (a comma inside a value "
                        "needs quotes)") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: not a readable .csv file ({exc.__class__.__name__})") from None
    if frame.empty:
        raise UserError(f"{p}: no rows")
    names = pd.Index([str(c).strip() for c in header.iloc[0]])
    if len(names) > 1 and names[-1] == "" and frame.iloc[:, -1].isna().all():
        # a comma at the end of every line, the header's too: no column
        names, frame = names[:-1], frame.iloc[:, :-1]
    repeated = names[names.duplicated()]
    if len(repeated):  # read_csv itself would have renamed a repeat "age.1"
        raise UserError(f"{p}: the column {repeated[0]!r} appears more than once")
    frame.columns = [str(c).strip() for c in frame.columns]
    frame = text_cells(frame)
    labels = None
    if label in frame.columns:
        labels = frame.pop(label) if need_labels else None
        if not need_labels:
            frame = frame.drop(columns=[label], errors="ignore")
    elif need_labels:
        raise UserError(f"{p}: no label column {label!r} (columns: {', '.join(frame.columns)})")
    if labels is not None:
        if labels.isna().any():
            raise UserError(f"{p}: the label column {label!r} has missing values")
        labels = _integers_or_text(labels)
    if frame.shape[1] == 0:
        raise UserError(f"{p}: no feature columns besides the label")
    return frame, labels


def text_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells of text (``NaN`` where missing) as every CSV file's are read: without surrounding
    spaces, and ``NaN`` where they hold one of ``MISSING_VALUES``."""
    stripped = frame.apply(lambda column: column.str.strip())
    return stripped.mask(stripped.isin(MISSING_VALUES))  # a tenth of replace()'s time


def _integers_or_text(column: pd.Series) -> NDArray:
    """A column of text as int64 when every value is an integer (``3``, ``-1``), else as text."""
    if column.str.fullmatch(r"[+-]?\d{1,18}").all():  # within int64
        return column.astype(np.int64).to_numpy()
    return column.to_numpy(dtype=object)


def _visible(folder: Path) -> list[Path]:
    """The entries of ``folder`` but hidden ones (``.ipynb_checkpoints``, ``.DS_Store``),
    sorted."""
    return sorted(e for e in folder.iterdir() if not e.name.startswith("."))


def _is_image(entry: Path) -> bool:
    return entry.is_file() and entry.suffix.lower() in IMAGE_SUFFIXES


def _image_files(folder: Path, private: bool = False) -> tuple[list[Path], list[str] | None]:
    """Image files of ``folder`` and their class (its subfolder's name), or ``None`` classes
    when the images lie directly in the folder; a folder with both is refused (which would
    be meant?). The warning of skipped entries names one of them, unless the folder is
    ``private`` (file names are private data)."""
    entries = _visible(folder)  # each folder is listed once
    subfolders = [d for d in entries if d.is_dir()]
    loose = [e for e in entries if _is_image(e)]
    if subfolders and loose:
        raise UserError(f"{folder}: holds both images and subfolders ({subfolders[0].name}, "
                        "...): put the images in class subfolders, or leave no subfolder")
    if subfolders:
        files, names, skipped = [], [], []
        for d in subfolders:
            inside = _visible(d)
            found = [e for e in inside if _is_image(e)]
            files += found
            names += [d.name] * len(found)
            skipped += [e for e in inside if not _is_image(e)]
        skipped += [e for e in entries if not e.is_dir()]
    else:
        files, names, skipped = loose, None, [e for e in entries if not _is_image(e)]
    if skipped:  # a private folder's count and names are statistics of private data
        what = ("entries" if private else
                f"{len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'}")
        example = ("their number and names are private data, not shown" if private else
                   f"{skipped[0].relative_to(folder).as_posix()}, ...")
        warnings.warn(f"{folder}: {what} skipped, not {'/'.join(IMAGE_SUFFIXES)} images one "
                      f"level down ({example})", stacklevel=2)
    return files, names


def image_folder_classes(path: str | Path) -> list[str]:
    """The class subfolders of an image folder (its label set), sorted; hidden ones are not
    classes."""
    return [d.name for d in _visible(Path(path)) if d.is_dir()]


def _eight_bit(image: Image.Image) -> Image.Image:
    """A 16- or 32-bit grey image as 8-bit grey (the top 8 of 16 bits): Pillow's own conversion
    clips every value above 255 to white."""
    from PIL import Image

    if image.mode not in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        return image.copy()
    wide = np.clip(np.asarray(image, np.int64), 0, 65535)
    return Image.fromarray((wide >> 8).astype(np.uint8), "L")


def image_names(path: str | Path) -> list[str]:
    """The image files of a folder, relative to it, in the order ``read_image_folder`` reads
    them (whose warning of skipped entries is not repeated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [f.relative_to(path).as_posix() for f in _image_files(Path(path))[0]]


def content_digest(path: str | Path, private: bool = False) -> str:
    """sha256 (hex) of what a data file holds, however it was named or moved: a file's bytes,
    or a folder's images, each by its name relative to the folder and its bytes, in the order
    ``read_image_folder`` reads them. Every part after its length in bytes, and a file's
    digest apart from a folder's, so that no two contents give one digest. An image that
    cannot be read is one error line, naming only its class folder in a ``private`` folder."""
    p = Path(path)
    _exists(p)
    digest = hashlib.sha256()
    if p.is_dir():
        digest.update(b"folder\0")
        for name in image_names(p):
            raw = os.fsencode(name)
            try:
                digest.update(b"%d:%s%d:" % (len(raw), raw, (p / name).stat().st_size))
                _hash_file(p / name, digest)
            except OSError as exc:
                where = _private_place(p, p / name) if private else str(p / name)
                raise UserError(f"{where}: unreadable image ({exc.__class__.__name__})"
                                ) from None
    else:
        digest.update(b"file\0")
        try:
            _hash_file(p, digest)
        except OSError as exc:
            raise UserError(f"{p}: unreadable ({exc.__class__.__name__})") from None
    return digest.hexdigest()


def _hash_file(path: Path, digest: Any, chunk: int = 1 << 20) -> None:
    """Feed ``path``'s bytes to ``digest`` a chunk at a time (a large file is not held)."""
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)


def available_memory() -> int | None:
    """Bytes of memory this process can still take: Linux's ``MemAvailable`` (/proc/meminfo),
    or less where a cgroup (a container) limits it (``memory.max`` less ``memory.current``);
    None where the system says neither."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            found += [int(line.split()[1]) * 1024 for line in fh
                      if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        group = Path("/sys/fs/cgroup")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((group / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _check_memory(folder: Path, count: int, channels: int, size: tuple[int, int],
                  private: bool) -> None:
    """Refuse images whose float32 array would not fit in the memory available now: decoding
    them would end with the kernel killing the process, not with a message. A ``private``
    folder's message says neither how many images it holds nor the memory they need (which
    would tell how many)."""
    need = 4 * count * channels * size[0] * size[1]
    free = available_memory()
    if free is not None and need > free:
        what = ("its images need more memory as float32 than" if private else
                f"{count} images of {size[0]}x{size[1]} pixels need {need / 2**30:.1f} GiB "
                "as float32, more than")
        raise UserError(f"{folder}: {what} the {free / 2**30:.1f} GiB of memory available: "
                        "give a smaller [data] image_size")


def _private_place(folder: Path, file: Path) -> str:
    """A private image named by its class folder alone: ``FOLDER/CLASS/: an image``; not its
    name, nor its place in the folder (the place of the last one is how many images the class
    holds, a count of private data)."""
    where = file.parent.relative_to(folder).as_posix()
    return (f"{folder}/{'' if where == '.' else where + '/'}: an image (names and places of "
            "private files are not shown)")


def read_image_folder(path: str | Path, need_labels: bool, mode: str | None = None,
                      size: tuple[int, int] | None = None, private: bool = False
                      ) -> tuple[NDArray[np.float32], NDArray | None, str, tuple[int, int]]:
    """Images ``float32 [n, C, H, W]`` in [0, 1], their class names (if ``need_labels``), and
    the colour mode and size (W, H) used. ``mode`` (``L`` or ``RGB``) and ``size`` default to
    those of the folder: grey if every image is, and the first image's size; every image is
    converted and resized to them (bilinear). Errors about a ``private`` folder's image name
    its class folder only, not the image nor its place (private data, design.md's privacy
    rule 2)."""
    from PIL import Image

    p = Path(path)
    _exists(p)
    if not p.is_dir():
        raise UserError(f"{p}: not a folder of images")
    files, names = _image_files(p, private)
    if not files:
        raise UserError(f"{p}: no .png or .jpg images")
    if need_labels and names is None:
        raise UserError(f"{p}: labelled images go in one subfolder per class")
    images = []
    for f in files:
        try:
            with warnings.catch_warnings(record=private) as said, Image.open(f) as im:
                im.load()
                images.append(_eight_bit(im))
        except Exception as exc:  # Pillow on a user's file: OSError, SyntaxError, ...
            where = _private_place(p, f) if private else str(f)
            raise UserError(f"{where}: unreadable image ({exc.__class__.__name__})") from None
        if said:  # Pillow's warnings quote an image's size: one line naming its folder only
            warnings.warn(f"{_private_place(p, f)}: Pillow warned of it "
                          f"({said[0].category.__name__})", stacklevel=2)
    if mode is None:
        mode = "L" if all(im.mode in ("1", "L", "I;16", "I") for im in images) else "RGB"
    if size is None:
        size = images[0].size
        others = sum(im.size != size for im in images)
        if others:  # a public folder's (a private one is resized to the public images' size)
            warnings.warn(f"{p}: {others} of its {len(images)} images "
                          f"{'is' if others == 1 else 'are'} not the size of the first "
                          f"({files[0].relative_to(p)}), {size[1]} high and {size[0]} wide: "
                          "every image is resized to it (choose the size with --image-size H W, "
                          "[data] image_size or DataFiles(image_size=))", stacklevel=2)
    channels = 1 if mode == "L" else 3
    _check_memory(p, len(images), channels, size, private)
    x = np.empty((len(images), channels, size[1], size[0]), np.float32)  # filled in place:
    for i, im in enumerate(images):  # the array once, not a list, a stack and a copy
        pixels = np.asarray(im.convert(mode).resize(size, Image.BILINEAR), np.float32)
        x[i] = (pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)) / 255.0
    labels = np.asarray(names, dtype=object) if need_labels and names is not None else None
    return x, labels, mode, size
