"""The run configuration (``config.toml`` of a run directory), validated.

A config names the dataset and the settings of every stage. Presets ship in ``pate/presets``;
``load_config`` takes a preset name or a TOML path and returns a validated ``RunConfig``.
"""

from __future__ import annotations

import difflib
import json
import sys
import tomllib
import typing
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from analysis.costs import check_threshold
from analysis.mechanisms import ConfidentGNMax, InteractiveGNMax, ParameterError
from analysis.noise_families import DEFAULT_DOF, DENOISERS, NOISE_FAMILIES
from pate.data.augment import AUGMENTATIONS
from pate.data.datasets import DEFAULT_DATASET, LOADERS, data_dir_problem
from pate.data.partitions import PARTITIONS, partition_problem
from pate.data.task import Benchmark, DataFiles, DataSource
from pate.errors import UserError
from student.choices import (
    ARCHITECTURES,
    DPSGD_MODELS,
    arch_method_problem,
)
from student.defaults import DPSGD, MOST_WIDTH, STUDENT
from teachers.choices import (
    MODELS,
    gpu_share_problem,
    is_import_path,
    model_name_problem,
    ray_address_problem,
)
from teachers.defaults import TEACHERS
from teachers.rng import SEED_LIMIT


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class DataConfig(_Section):
    """A built-in dataset (``dataset``, ``data_dir``, ``pool_size``) or your own files
    (``private``, ``public``, optional ``test``; ``label`` for a CSV, ``classes`` the label
    set, ``image_size`` [height, width] for image folders, ``key`` a CSV's column naming whose
    each row is). Relative paths are relative to the
    config file."""

    dataset: Literal[tuple(LOADERS)] | None = None  # type: ignore[valid-type]
    data_dir: str | None = None
    pool_size: int | None = Field(default=None, gt=0)
    private: str | None = None
    public: str | None = None
    test: str | None = None
    label: str | None = None
    classes: list[str] | None = Field(default=None, min_length=2)
    image_size: list[int] | None = Field(default=None, min_length=2, max_length=2)
    key: str | None = None  # a CSV's column naming whose each row is (teachers.partition key)

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        files = (self.private, self.public, self.test, self.label, self.classes, self.image_size,
                 self.key)
        if any(v is not None for v in files):
            if self.dataset is not None or self.pool_size is not None:
                raise ValueError("give dataset (a built-in dataset) or private and public (your "
                                 "files), not both")
            if self.private is None or self.public is None:
                raise ValueError("your own data needs both private and public")
            try:
                self.source()  # the files' own checks (pate.data.task.DataFiles), at load
            except UserError as exc:  # said as the config's other mistakes are, with its key
                raise ValueError(str(exc)) from None
        problem = data_dir_problem(self.dataset or DEFAULT_DATASET, self.data_dir)
        if problem:
            raise ValueError(problem)
        return self

    def source(self) -> DataSource:
        """The data this section describes (the default dataset when it names none)."""
        if self.private is not None and self.public is not None:
            return DataFiles(self.private, self.public, self.test, self.label,
                             None if self.classes is None else tuple(self.classes),
                             None if self.image_size is None else
                             (self.image_size[0], self.image_size[1]), self.key)
        return Benchmark(self.dataset or DEFAULT_DATASET, self.data_dir, self.pool_size)

    def resolved(self, base: Path) -> DataConfig:
        """The section with its file paths made absolute against ``base`` (the config file's
        folder)."""
        paths = {k: str((base / v).resolve()) for k in ("private", "public", "test", "data_dir")
                 if (v := getattr(self, k)) is not None}
        return self.model_copy(update=paths)


class TeachersConfig(_Section):
    """``pate teachers train``'s settings; ``None``: the library's default (teachers.defaults)."""

    count: int = Field(default=TEACHERS.count, ge=1)
    # a built-in (MODELS) or a user's "package.module:factory"; None: DEFAULT_MODEL of the data
    model: str | None = None
    epochs: int = Field(default=TEACHERS.epochs, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    lr: float | None = Field(default=None, gt=0)
    mixup: float = Field(default=0.0, ge=0)
    augment: Literal[("auto", *AUGMENTATIONS)] = "auto"  # type: ignore[valid-type]
    seed: int = Field(default=0, ge=0, lt=SEED_LIMIT)
    # how the private rows are dealt (teachers.partition): by record, the analysis holds for
    # adding or removing one record, DP-SGD's relation, and not only for changing one; by key
    # (data.key), for adding or removing all of one person's rows
    partition: Literal[PARTITIONS] = "position"  # type: ignore[valid-type]
    workers: int = Field(default=1, ge=1)
    shard_size: int = Field(default=TEACHERS.shard_size, ge=1)
    device: Literal["cpu", "cuda"] = "cpu"
    gpus_per_shard: float = 1.0
    ray_address: str | None = None

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        problem = None if value is None else model_name_problem(value, MODELS)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("gpus_per_shard")
    @classmethod
    def _gpu_share(cls, value: float) -> float:
        if problem := gpu_share_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        if problem := ray_address_problem(value):
            raise ValueError(problem)
        return value


class AggregatorConfig(_Section):
    """Confident-GNMax for round 1, Interactive-GNMax (plus gamma) for round 2 (PATE 2018,
    Algorithms 1 and 2); the budget is in epsilon at ``delta``, charged with the
    data-independent bound.

    Round 2 takes round 1's T, sigma1 and sigma2 unless ``interactive_*`` say otherwise. It
    usually should: its threshold step sees max_j (n_j - N p_j), which is near 0 wherever the
    student already agrees with the teachers, so a T several sigma1 above 0 makes those queries
    almost free (their data-dependent cost vanishes) while strong disagreements still pass."""

    threshold: float
    sigma1: float = Field(gt=0)
    sigma2: float = Field(gt=0)
    gamma: float = Field(default=0.9, ge=0, le=1)
    interactive_threshold: float | None = None
    interactive_sigma1: float | None = Field(default=None, gt=0)
    interactive_sigma2: float | None = Field(default=None, gt=0)
    budget_epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    lnmax_scale: float = Field(default=20.0, gt=0)  # LNMax curve of the report's comparison
    allow_large_delta: bool = False  # accept delta >= 1/n (pate.aggregation.delta_policy)
    # release the smooth-sensitivity-sanitised epsilon at the last round (decided before the
    # run: with few teachers it exceeds the data-independent one, docs/cli.md)
    release_sanitised: bool = True
    # a ledger shared by the runs on one body of private data (an SQLite file, relative to the
    # config file, or a SQLAlchemy URL): one budget for all of them; None: the run's own
    ledger: str | None = None

    @field_validator("ledger")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        if value is not None and "://" in value and urlsplit(value).password is not None:
            raise ValueError("a password in the ledger's URL would be written to the run's "
                             "config.toml and travel with the run directory: leave it out and "
                             "give it to the database client (PGPASSWORD, ~/.pgpass)")
        return value

    @model_validator(mode="after")
    def _mechanisms_valid(self) -> AggregatorConfig:
        """Both rounds' mechanisms as the analysis validates them (``analysis.mechanisms``)."""
        for mechanism in (ConfidentGNMax.name, InteractiveGNMax.name):
            self.round_mechanism(mechanism)
        return self

    def round_mechanism(self, mechanism: str) -> ConfidentGNMax | InteractiveGNMax:
        """The mechanism of the round answered by ``mechanism`` (``confident`` or
        ``interactive``), with this section's parameters."""
        if mechanism not in (ConfidentGNMax.name, InteractiveGNMax.name):
            raise UserError(f"a run's rounds are confident or interactive, not {mechanism!r}")
        if mechanism == ConfidentGNMax.name:
            return ConfidentGNMax(self.threshold, self.sigma1, self.sigma2)
        own = {name: f"interactive_{name}" for name in ("threshold", "sigma1", "sigma2")
               if getattr(self, f"interactive_{name}") is not None}  # the keys that say it
        try:
            return InteractiveGNMax(
                **{name: getattr(self, own.get(name, name))
                   for name in ("threshold", "sigma1", "sigma2", "gamma")})
        except ParameterError as exc:
            raise ParameterError(tuple(own.get(n, n) for n in exc.names), exc.detail) from None


class StudentConfig(_Section):
    """``pate student train``'s settings (student.options.StudentOptions), the same for
    every round."""

    method: Literal["vat", "gan", "supervised"] = "vat"
    # None: the method's default
    arch: str | None = None  # a built-in (ARCHITECTURES) or a user's "package.module:factory"
    queries: int = Field(default=STUDENT.queries, ge=1)
    # A second Confident-GNMax round on the pool rows the round-1 student is least sure of
    # (stage student-active); `select` is round 1's selection.
    active_queries: int = Field(default=0, ge=0)
    interactive_queries: int = Field(default=0, ge=0)
    # round 1 has no student yet to be unsure: `uncertainty` is the active round's
    select: Literal["first", "random"] = "random"
    request_size: int = Field(default=STUDENT.request_size, ge=1)
    epochs: int = Field(default=STUDENT.epochs, ge=1)
    width: int = Field(default=STUDENT.width, ge=1, le=MOST_WIDTH)
    batch_size: int = Field(default=STUDENT.batch_size, ge=1)
    unlabelled_batch_size: int = Field(default=STUDENT.unlabelled_batch_size, ge=1)
    lr: float | None = Field(default=None, gt=0)
    augment: Literal[AUGMENTATIONS] = "none"  # type: ignore[valid-type]
    balance_classes: bool = False
    vat_eps: float = Field(default=STUDENT.vat_eps, gt=0)
    entmin: bool = False
    encoder_epochs: int | None = Field(default=None, ge=1)
    seed: int = Field(default=0, ge=0, lt=SEED_LIMIT)
    device: Literal["cpu", "cuda"] = "cpu"

    @field_validator("arch")
    @classmethod
    def _arch_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        problem = None if value is None else model_name_problem(value, ARCHITECTURES)
        if problem:
            raise ValueError(problem)
        method = info.data.get("method")
        problem = None if method is None else arch_method_problem(method, value)
        if problem:
            raise ValueError(problem)
        return value

    def retrain_flags(self) -> str:
        """The flags that make ``pate student train --queries 0`` train this student: its
        method and the training settings that differ from the command's defaults (which the
        command takes for every flag left out, not the run's ``[student]``)."""
        usual = StudentConfig(method=self.method)
        flags = [f"--method {self.method}"]
        for name in _RETRAIN_FIELDS:
            value = getattr(self, name)
            if value == getattr(usual, name):
                continue
            flag = "--" + name.replace("_", "-")
            flags.append(flag if value is True else f"{flag} {value}")
        return " ".join(flags)


# the [student] settings that are training flags of ``pate student train`` (the others set
# the query rounds)
_RETRAIN_FIELDS = ("arch", "width", "epochs", "batch_size", "unlabelled_batch_size", "lr",
                   "augment", "balance_classes", "vat_eps", "entmin", "encoder_epochs", "seed",
                   "device")


class DPSGDConfig(_Section):
    """``pate dpsgd train``'s settings (student.dpsgd.DPSGDConfig), trained to ``epsilon``;
    ``noise``, ``dof``, ``encode``, ``encode_seed`` and ``denoise`` select gradient encoding and
    denoising (student.encoded_dpsgd.EncodingConfig; the defaults are plain DP-SGD); ``model``
    is the network (``student.choices.DPSGD_MODELS``; unset: ``DEFAULT_DPSGD_MODEL`` of the
    data's kind)."""

    enabled: bool = False
    model: str | None = None
    epsilon: float = Field(default=3.0, gt=0)
    epochs: int = Field(default=DPSGD.epochs, ge=1)
    batch_size: int = Field(default=DPSGD.batch_size, ge=1)
    lr: float = Field(default=DPSGD.lr, gt=0)
    momentum: float = Field(default=DPSGD.momentum, ge=0, lt=1)
    max_grad_norm: float = Field(default=DPSGD.max_grad_norm, gt=0)
    noise: Literal[NOISE_FAMILIES] = "gaussian"  # type: ignore[valid-type]
    dof: float = Field(default=DEFAULT_DOF, gt=2)
    encode: int | None = Field(default=None, ge=1)
    encode_seed: int = Field(default=0, ge=0, lt=SEED_LIMIT)
    denoise: Literal[DENOISERS] = "none"  # type: ignore[valid-type]

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        if value is not None and value not in DPSGD_MODELS:
            raise ValueError(f"model must be one of {', '.join(DPSGD_MODELS)}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _encoded_if_not_gaussian(self) -> DPSGDConfig:
        if self.noise != "gaussian" and self.encode is None:
            raise ValueError(f"{self.noise} noise needs encode (the number of profiles)")
        return self


class CompareConfig(_Section):
    """The owner-only evaluation (``pate run``'s ``compare`` stage): DP-SGD trained with the
    ``[dpsgd]`` settings to the student's epsilons named in ``dpsgd_at``, the teachers'
    architecture trained on all the private data (``nonprivate_epochs`` passes in batches of
    ``nonprivate_batch_size``), and students trained on the first ``prefixes`` (fractions) of
    the queries asked, for the privacy-utility curve."""

    enabled: bool = False
    dpsgd_at: list[Literal["sanitised", "data-independent"]] = Field(
        default=["sanitised", "data-independent"])
    nonprivate_epochs: int = Field(default=5, ge=1)
    nonprivate_batch_size: int = Field(default=64, ge=1)
    prefixes: list[float] = Field(default=[0.25, 0.5])

    @field_validator("prefixes")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        if any(not 0 < f < 1 for f in value):
            raise ValueError("prefixes are fractions of the queries asked, in (0, 1)")
        return value


# ``pate run``'s stages, in order (pate.pipeline); RunConfig.stages says which a config runs.
STAGES: tuple[str, ...] = ("teachers", "votes", "student-confident", "student-active",
                           "student-interactive", "dpsgd", "compare", "report")


class RunConfig(_Section):
    name: str
    data: DataConfig = DataConfig()
    teachers: TeachersConfig = TeachersConfig()
    aggregator: AggregatorConfig
    student: StudentConfig = StudentConfig()
    dpsgd: DPSGDConfig = DPSGDConfig()
    compare: CompareConfig = CompareConfig()

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, value: str) -> str:
        """The default run directory is runs/<name>: one folder name, not a path."""
        if (value in ("", ".", "..") or "/" in value or "\\" in value
                or any(ord(c) < 32 or ord(c) == 127 for c in value)):
            raise ValueError(f"name must be a folder name (runs/<name>), got {value!r}")
        return value

    @model_validator(mode="after")
    def _threshold_in_range(self) -> RunConfig:
        """Each round's threshold in [0, teachers.count] (``analysis.costs.check_threshold``),
        named by the key that sets it."""
        a = self.aggregator
        for mechanism, key in ((ConfidentGNMax.name, "threshold"),
                               (InteractiveGNMax.name, "threshold" if a.interactive_threshold
                                is None else "interactive_threshold")):
            try:
                check_threshold(a.round_mechanism(mechanism), self.teachers.count)
            except ParameterError as exc:
                raise ParameterError(f"aggregator.{key}", exc.detail) from None
        return self

    @model_validator(mode="after")
    def _partition_and_key(self) -> RunConfig:
        """A key column (``data.key``) goes with dealing the rows by key, and only with it."""
        if problem := partition_problem(self.teachers.partition, self.data.key):
            raise ValueError(problem)
        return self

    def stages(self) -> tuple[str, ...]:
        """The stages of ``STAGES`` this config runs: the optional ones only when asked for."""
        optional = {"student-active": self.student.active_queries > 0,
                    "student-interactive": self.student.interactive_queries > 0,
                    "dpsgd": self.dpsgd.enabled, "compare": self.compare.enabled}
        return tuple(s for s in STAGES if optional.get(s, True))


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files("pate.presets").iterdir()
                  if p.name.endswith(".toml"))


# pydantic's errors of a config's shape, in its words: said of a section (a top-level table),
# or of a key
_SAID: dict[str, tuple[str, str]] = {
    "extra_forbidden": ("no such section", "no such key"),
    "missing": ("a required section, missing", "a required key, missing"),
    "model_type": ("must be a section ([name] and its keys), not a value",) * 2,  # sections only
}


def _first_error(exc: ValidationError) -> str:
    """The first error, key and message; an unknown key comes first, since a key missing
    beside it is most likely the same key misspelt."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    message = err["msg"].removeprefix("Value error, ")  # pydantic's, of our validators' words
    # a value's type or range, in the voice of the project's other messages ("must be ...")
    if message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    if not err["loc"]:  # a check of the whole config: its message names the keys
        return message
    said = _SAID.get(err["type"])  # in the config's words, not pydantic's
    if said is not None:
        loc = err["loc"]
        section = len(loc) == 1 and (isinstance(err.get("input"), dict)
                                     if err["type"] == "extra_forbidden" else bool(_keys_of(loc)))
        message = said[0 if section else 1]
    if err["type"] == "extra_forbidden":
        near = difflib.get_close_matches(str(err["loc"][-1]), _keys_of(err["loc"][:-1]), n=1)
        message += f" (did you mean {near[0]}?)" if near else ""
    return f"{'.'.join(str(x) for x in err['loc'])}: {message}"


def _keys_of(section: tuple[Any, ...]) -> list[str]:
    """The keys the config accepts at ``section`` (``("teachers",)``; ``()``: its sections)."""
    model: Any = RunConfig
    for part in section:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        types = [field.annotation, *typing.get_args(field.annotation)] if field else []
        model = next((t for t in types if isinstance(t, type) and issubclass(t, BaseModel)),
                     None)
        if model is None:
            return []
    return list(model.model_fields)


def parse_config(text: str, origin: str) -> RunConfig:
    """Validate TOML text; errors name the file and the offending key in one line."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{origin}: invalid TOML: {exc}") from None
    report = raw.get("report")
    if isinstance(report, dict) and set(report) <= {"non_private_baseline"}:
        # Run directories written before the compare stage have a [report] section whose only
        # key, a typed-in non-private accuracy, the compare stage now measures: it is dropped,
        # and said so where it was given (a number typed in and never shown would mislead).
        if "non_private_baseline" in report:
            warnings.warn(f"{origin}: report.non_private_baseline is no longer read: the "
                          "compare stage measures the non-private model on the private data "
                          "(the owner-only page); the key is ignored: delete it",
                          UserWarning, stacklevel=2)
        del raw["report"]
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"{origin}: {_first_error(exc)}") from None


def recorded_config(config_file: Path) -> RunConfig | None:
    """The config a run recorded (its ``config.toml``, ``RunDir.config``), None where it has
    none."""
    return (parse_config(config_file.read_text(), str(config_file)) if config_file.is_file()
            else None)


def load_config(preset_or_path: str) -> RunConfig:
    """A shipped preset by name (``fashion-mnist-small``) or a TOML file. A preset's name names
    the preset even where a file or folder of that name lies in the working directory (a run
    directory named after it, say): such a file is ``./NAME``."""
    path = Path(preset_or_path)
    if path.suffix == ".toml" or (path.exists() and preset_or_path not in preset_names()):
        if not path.is_file():
            raise UserError(f"{path}: no such config file")
        try:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as some editors write
        except UnicodeDecodeError:
            raise UserError(f"{path}: not a TOML file (not UTF-8 text)") from None
        config = parse_config(text, str(path))
        folder = str(path.parent.resolve())  # a network's module may lie beside the config,
        if any(name is not None and is_import_path(name)  # as its data files do
               for name in (config.teachers.model, config.student.arch)) and (
                folder not in sys.path):
            sys.path.append(folder)  # after the working directory (load_factory puts it first)
        ledger = config.aggregator.ledger
        aggregator = (config.aggregator if ledger is None or "://" in ledger
                      else config.aggregator.model_copy(
                          update={"ledger": str((path.parent / ledger).resolve())}))
        return config.model_copy(update={"data": config.data.resolved(path.parent),
                                         "aggregator": aggregator})
    if path.is_file():  # a preset's name, and a file of that name here
        warnings.warn(f"{preset_or_path} is the preset of that name, not the file here "
                      f"(./{preset_or_path} reads the file)", UserWarning, stacklevel=2)
    if preset_or_path not in preset_names():
        raise UserError(f"unknown preset {preset_or_path!r}; presets: "
                        f"{', '.join(preset_names())}, or give a .toml file")
    text = resources.files("pate.presets").joinpath(f"{preset_or_path}.toml").read_text()
    return parse_config(text, f"preset {preset_or_path}")


def dump_config(config: RunConfig) -> str:
    """TOML for ``config.toml``: the resolved configuration, every key written out; one left
    unset (None: TOML has no null) as a comment."""
    lines = [f"name = {_toml(config.name)}"]
    for section, model in config:
        if isinstance(model, BaseModel):
            lines.append(f"\n[{section}]")
            lines += [f"# {key} = (not set)" if value is None else f"{key} = {_toml(value)}"
                      for key, value in model]
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    # a TOML basic string: JSON's escapes are TOML's (quotes, backslashes, every control
    # character), but for DEL, which TOML also forbids raw
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
