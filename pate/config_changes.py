"""What a rerun of a run may change: the keys in which two configs differ, each key one leaves
unset taken as the value it stands for, and which of those a run that has made something may
not take.

A config that writes a default out (``pool_size = 5000`` for Fashion-MNIST, ``model = "cnn"``
for images) is the same run as one that leaves it unset: ``_UNSET_MEANS`` says, for each key
whose unset value stands for one the rest of the config decides, how that value is found.
Keys whose unset value means something of its own (no ledger named: the run's own; no
``encode``: plain DP-SGD) are not in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache

from pate.config import STAGES, RunConfig
from pate.data.datasets import DEFAULT_DATASET, load_dataset
from pate.data.task import data_kind
from pate.errors import UserError
from student.choices import DEFAULT_DPSGD_MODEL, METHOD_RECORDS
from teachers.choices import DEFAULT_MODEL
from teachers.defaults import TEACHERS

# Keys that say where a stage runs, not what it computes: a stopped run may resume elsewhere
# (another Ray cluster, a GPU, another share of one).
PLACEMENT_KEYS: dict[str, tuple[str, ...]] = {
    "teachers": ("workers", "device", "gpus_per_shard", "ray_address"), "student": ("device",)}


# The sections a rerun may change while none of the stages they feed has finished: a round that
# failed (no answer, the budget), a comparison that could not run. The data and the teachers'
# settings made what the first stages made (the partition, the teachers, the votes) and never
# change once anything is made.
RELAXED_SECTIONS: dict[str, tuple[str, ...]] = {
    "aggregator": STAGES[2:], "student": STAGES[2:], "dpsgd": ("dpsgd", "compare", "report"),
    "compare": ("compare", "report")}


def fixed_differences(first: RunConfig, other: RunConfig, finished: Iterable[str]) -> list[str]:
    """The ``config_differences`` a rerun of a run that made something and finished
    ``finished`` (its stages) may not make: every key but the run's ``name`` (what the report
    calls it) and those of ``RELAXED_SECTIONS`` whose stages have not finished."""
    done = set(finished)
    return [key for key in config_differences(first, other) if key != "name"  # a label only
            and ((stages := RELAXED_SECTIONS.get(key.split(".")[0])) is None
                 or done.intersection(stages))]


def config_differences(first: RunConfig, other: RunConfig, placement: bool = False
                       ) -> list[str]:
    """The keys (``section.key``, or ``name``) whose values differ between two configs, a key
    that one leaves unset and the other sets compared as the value it stands for
    (``_UNSET_MEANS``); :data:`PLACEMENT_KEYS` (a run may change those) only with
    ``placement``."""
    a, b = first.model_dump(), other.model_dump()
    keys = [k for k in a if not isinstance(a[k], dict) and a[k] != b[k]]
    return keys + [f"{section}.{k}" for section in a if isinstance(a[section], dict)
                   for k in a[section] if a[section][k] != b[section][k]
                   and (placement or k not in PLACEMENT_KEYS.get(section, ()))
                   and not _same_once_taken(first, other, section, k)]


def _same_once_taken(first: RunConfig, other: RunConfig, section: str, key: str) -> bool:
    """Whether ``section.key``, unset in one config and set in the other, is set to the value
    the unset one stands for; False where that cannot be known (the public file unreadable:
    the stage that reads it says so)."""
    values = [getattr(getattr(c, section), key) for c in (first, other)]
    means = _UNSET_MEANS.get((section, key))
    if means is None or values.count(None) != 1:
        return False
    unset, given = (first, values[1]) if values[0] is None else (other, values[0])
    try:
        return bool(means(unset) == given)
    except UserError:
        return False


def _kind(config: RunConfig) -> str:
    """``image`` or ``tabular``: the kind of the config's data (``data_kind``)."""
    return data_kind(config.data.source())


@cache
def _half_the_test_split(dataset: str, data_dir: str | None) -> int:
    """A built-in dataset's pool when none is set: half its test split
    (``pate.data.datasets.public_split``)."""
    return len(load_dataset(dataset, data_dir, need_train=False).test_y) // 2


def _student_arch(config: RunConfig) -> str:
    """The student's network when none is named (``student.training.method_for_data``): the
    MLP on tables, else the method's."""
    return ("mlp" if _kind(config) == "tabular"
            else METHOD_RECORDS[config.student.method].default_arch)


# For each key whose unset value stands for a value decided by the rest of the config, how that
# value is found; each says where the stage that reads the key decides it.
_UNSET_MEANS: dict[tuple[str, str], Callable[[RunConfig], object]] = {
    ("data", "dataset"): lambda c: DEFAULT_DATASET,  # DataConfig.source
    ("data", "pool_size"): lambda c: _half_the_test_split(c.data.dataset or DEFAULT_DATASET,
                                                          c.data.data_dir),
    ("teachers", "model"): lambda c: DEFAULT_MODEL[_kind(c)],  # teachers.ensemble
    ("teachers", "batch_size"): lambda c: TEACHERS.batch_size,  # TrainConfig
    ("teachers", "lr"): lambda c: TEACHERS.lr,
    ("aggregator", "interactive_threshold"): lambda c: c.aggregator.threshold,  # round_mechanism
    ("aggregator", "interactive_sigma1"): lambda c: c.aggregator.sigma1,
    ("aggregator", "interactive_sigma2"): lambda c: c.aggregator.sigma2,
    ("student", "arch"): _student_arch,  # student.training.MethodConfig
    ("student", "lr"): lambda c: METHOD_RECORDS[c.student.method].lr,
    ("dpsgd", "model"): lambda c: DEFAULT_DPSGD_MODEL[_kind(c)],  # student.dpsgd
}
