"""The PATE aggregation mechanisms as data: one frozen dataclass per mechanism holding its public
parameters, validated once at construction, and one way to read and write them.

LNMax: PATE 2017 (Papernot et al., arXiv 1610.05755, §2.2). GNMax: PATE 2018 (Papernot et al.,
arXiv 1802.08908, §4.1). Confident-GNMax and Interactive-GNMax: PATE 2018 §4.2-4.3, Algorithms 1
and 2 (docs/privacy-math.md §2-4). What a mechanism costs is decided in one place,
``analysis.costs``; the record ``{"mechanism": name, **parameters}`` of ``mechanism_to_dict`` is
the one form in which TOML, JSON and command-line flags describe a mechanism.

A mechanism's parameters are public: they are part of the privacy guarantee.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar

# The noise scales the analysis computes (pate analyze checked for every mechanism at both ends
# and beyond); noise of 1e-6 votes is no noise, and of 1e12 votes no answer.
NOISE_RANGE = (1e-6, 1e12)


class ParameterError(ValueError):
    """A parameter that is invalid, missing or not taken: ``names`` (one or more), then
    ``detail``. ``str()`` names them bare, as a Python caller's keyword or a record's key;
    ``named("--")`` as a command line's flags."""

    def __init__(self, names: str | tuple[str, ...], detail: str) -> None:
        self.names = (names,) if isinstance(names, str) else tuple(names)
        self.detail = detail
        super().__init__(self.named(""))

    def named(self, prefix: str) -> str:
        """The message, each parameter's name after ``prefix``."""
        return f"{', '.join(prefix + name for name in self.names)} {self.detail}"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (a Ray worker may raise it)
        return type(self), (self.names, self.detail)


def _parameter(help: str, *, positive: bool = True, probability: bool = False,
               at_least: float | None = None, costless_value: float | None = None) -> Any:
    """A mechanism parameter: ``help`` describes it (the command line's help text), ``positive``
    requires it > 0 (a noise scale), ``probability`` requires it in [0, 1], ``at_least`` a
    lower bound and the reason for it. A parameter that does not enter the privacy cost names
    the ``costless_value`` a cost analysis that is not told it may take (any valid value gives
    the same cost)."""
    return field(metadata={"help": help, "positive": positive, "probability": probability,
                           "at_least": at_least, "costless_value": costless_value})


@dataclass(frozen=True)
class _Parameters:
    """Validation shared by every mechanism: each parameter is a finite number (stored as a
    float), in ``NOISE_RANGE`` where it is a noise scale and in [0, 1] where it is a
    probability."""

    name: ClassVar[str]   # the record's and the command line's name
    title: ClassVar[str]  # the name the papers and the report use

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ParameterError(f.name, f"must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ParameterError(f.name, f"must be finite, got {value!r}")
            if f.metadata["positive"] and value <= 0:
                raise ParameterError(f.name, f"must be > 0, got {value!r}")
            if f.metadata["positive"] and not NOISE_RANGE[0] <= value <= NOISE_RANGE[1]:
                raise ParameterError(f.name, f"must lie in [{NOISE_RANGE[0]:g}, "
                                     f"{NOISE_RANGE[1]:g}], got {value!r}: the analysis in "
                                     "float64 over- or underflows far outside it")
            if f.metadata["at_least"] is not None and value < f.metadata["at_least"]:
                raise ParameterError(f.name, f"must be >= {f.metadata['at_least']:g}, got "
                                     f"{value!r}")
            if f.metadata["probability"] and not 0.0 <= value <= 1.0:
                raise ParameterError(f.name, f"must be a probability in [0, 1], got {value!r}")
            object.__setattr__(self, f.name, float(value))


@dataclass(frozen=True)
class LNMax(_Parameters):
    """argmax_j (n_j + Lap(b)): Laplace noise of scale b on every count (PATE 2017, §2.2)."""

    name: ClassVar[str] = "lnmax"
    title: ClassVar[str] = "LNMax"
    scale: float = _parameter("LNMax: Laplace scale b (each answer is pure 2/b-DP)")


@dataclass(frozen=True)
class GNMax(_Parameters):
    """argmax_j (n_j + N(0, sigma^2)) (PATE 2018, §4.1)."""

    name: ClassVar[str] = "gnmax"
    title: ClassVar[str] = "GNMax"
    sigma: float = _parameter("GNMax: std of the Gaussian noise")


@dataclass(frozen=True)
class _Thresholded(_Parameters):
    """The noisy threshold step max_j n_j + N(0, sigma1^2) >= T, then GNMax with sigma2 on the
    queries that pass it (PATE 2018, §4.2)."""

    # below 0 every query would pass the threshold step: almost surely a mistake
    threshold: float = _parameter("Confident/Interactive: threshold T", positive=False,
                                  at_least=0.0)
    sigma1: float = _parameter("Confident/Interactive: threshold-step noise")
    sigma2: float = _parameter("Confident/Interactive: GNMax-step noise")


@dataclass(frozen=True)
class ConfidentGNMax(_Thresholded):
    """Confident-GNMax (PATE 2018, Algorithm 1): a query failing the threshold step gets no
    answer."""

    name: ClassVar[str] = "confident"
    title: ClassVar[str] = "Confident-GNMax"


@dataclass(frozen=True)
class InteractiveGNMax(_Thresholded):
    """Interactive-GNMax (PATE 2018, Algorithm 2): the threshold step sees max_j (n_j - N p_j)
    for the student's probabilities p; a query failing it is answered with the student's own
    label when its top probability exceeds gamma. That branch reads no private data, so gamma
    does not enter the privacy cost (its ``costless_value`` 1 turns the branch off)."""

    name: ClassVar[str] = "interactive"
    title: ClassVar[str] = "Interactive-GNMax"
    gamma: float = _parameter("Interactive: answer with the student's own label when its top "
                              "probability exceeds gamma", positive=False, probability=True,
                              costless_value=1.0)


Mechanism = LNMax | GNMax | ConfidentGNMax | InteractiveGNMax

# Every mechanism, by its name (the command line's ``--mechanism`` choices, the records' key).
MECHANISMS: dict[str, type[Mechanism]] = {
    cls.name: cls for cls in (LNMax, GNMax, ConfidentGNMax, InteractiveGNMax)}


def parameters(cls: type[Mechanism]) -> tuple[Field[Any], ...]:
    """The parameters a mechanism takes, in their order, with their ``help`` metadata."""
    return fields(cls)


def mechanism_from_dict(record: Mapping[str, Any]) -> Mechanism:
    """The mechanism of a record ``{"mechanism": name, **parameters}``, validated; a parameter
    the mechanism does not take is an error. Raises ValueError with one line (a
    ``ParameterError`` where a parameter is at fault)."""
    name = record.get("mechanism")
    cls = MECHANISMS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {name!r}")
    names = [f.name for f in parameters(cls)]
    extra = tuple(str(key) for key in record if key != "mechanism" and key not in names)
    if extra:
        raise ParameterError(extra, f"{'is' if len(extra) == 1 else 'are'} not taken by "
                                    f"mechanism {name}")
    missing = tuple(key for key in names if record.get(key) is None)
    if missing:
        raise ParameterError(missing, f"must be given: mechanism {name} needs "
                                      f"{'it' if len(missing) == 1 else 'them'}")
    return cls(**{key: record[key] for key in names})


def mechanism_to_dict(mechanism: Mechanism) -> dict[str, Any]:
    """The public record of a mechanism: ``{"mechanism": name, **parameters}``."""
    return {"mechanism": mechanism.name,
            **{f.name: getattr(mechanism, f.name) for f in parameters(type(mechanism))}}


def parameters_text(mechanism: Mechanism) -> str:
    """A mechanism's parameters as a line says them: ``threshold=150, sigma1=40, sigma2=20``."""
    return ", ".join(f"{f.name}={getattr(mechanism, f.name):.12g}"
                     for f in parameters(type(mechanism)))
