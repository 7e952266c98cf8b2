"""The options of ``pate audit models`` (``pate.audit.models``), kept apart from the workflow so
that the command line can describe them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from pate.errors import UserError

TARGETS: tuple[str, ...] = ("teacher", "nonprivate", "student", "control")
DEFAULT_CONFIDENCE = 0.95
# The positive control's canaries keep their labels ("true") or carry a random wrong one
# ("mislabelled": fitted only by memorising them, so a non-private model surely leaks them).
CONTROL_LABELS: tuple[str, ...] = ("mislabelled", "true")


@dataclass(frozen=True)
class ModelsAuditOptions:
    """What ``pate audit models`` trains and how (module docstring). ``seed`` fixes the audit's
    own choices (which teachers, canaries, coin flips) for an offline experiment; None draws them
    from the operating system's entropy. The aggregators' noise is never seeded."""

    targets: tuple[str, ...] = TARGETS
    teachers: int = 4
    canary_fraction: float = 0.5
    nonprivate_rows: int = 2000
    nonprivate_canaries: int = 2000
    control_rows: int = 200
    control_canaries: int = 500
    control_epochs: int = 40
    control_labels: str = "mislabelled"
    references: int = 4
    student_references: int = 1
    student_epochs: int | None = None
    confidence: float = DEFAULT_CONFIDENCE
    delta: float | None = None
    seed: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise UserError(f"targets must be among {', '.join(TARGETS)}, got "
                            f"{', '.join(unknown) or 'none'}")
        if not 0.0 < self.canary_fraction < 1.0:
            raise UserError(f"--canary-fraction must be in (0, 1), got {self.canary_fraction!r}")
        for flag, value, least in (
                ("--teachers", self.teachers, 1),
                ("--nonprivate-canaries", self.nonprivate_canaries, 1),
                ("--control-canaries", self.control_canaries, 1),
                ("--control-epochs", self.control_epochs, 1),
                ("--nonprivate-rows", self.nonprivate_rows, 0),
                ("--control-rows", self.control_rows, 0),
                ("--references", self.references, 0),
                ("--student-references", self.student_references, 0),
                ("--seed", 0 if self.seed is None else self.seed, 0)):
            if value < least:
                raise UserError(f"{flag} must be >= {least}, got {value}")
        if self.control_labels not in CONTROL_LABELS:
            raise UserError(f"--control-labels must be one of {', '.join(CONTROL_LABELS)}")
        if self.student_epochs is not None and self.student_epochs < 1:
            raise UserError("--student-epochs must be >= 1")
        if not 0.0 < self.confidence < 1.0:
            raise UserError(f"--confidence must be in (0, 1), got {self.confidence!r}")
        if self.delta is not None and not 0.0 < self.delta < 1.0:
            raise UserError(f"--delta must be in (0, 1), got {self.delta!r}")
