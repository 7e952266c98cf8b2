"""How large a delta may be, as a stated policy (docs/design.md, privacy rule 8).

An (epsilon, delta) guarantee may fail outright with probability delta; a mechanism that
publishes each of n records in the clear with probability delta is (0, delta)-DP, so a delta of
1/n or more protects nobody (C. Dwork, A. Roth, *The Algorithmic Foundations of Differential
Privacy*, 2014, §2.3: delta should be less than the inverse of any polynomial in n). The service
and the student refuse delta >= 1/n, n the private records, unless told otherwise, and warn
above 1/(10 n). The messages name neither n nor a bound computed from it: where the teachers
were dealt their rows by record or key, n is itself a statistic of the private data.
"""

from __future__ import annotations

import warnings

from pate.errors import UserError


def check_delta(delta: float, private_records: int | None, allow_large: bool = False,
                allow_name: str = "--allow-large-delta") -> None:
    """Refuse (``UserError``) ``delta >= 1/n`` unless ``allow_large`` (the option the caller
    calls ``allow_name``); warn above ``1/(10 n)``. Without ``private_records`` (unknown here)
    nothing is checked."""
    if private_records is None or private_records < 1:
        return
    n = private_records
    if delta >= 1.0 / n and not allow_large:
        raise UserError(f"delta {delta:g} is at least 1/n, n the number of private records: the "
                        "guarantee would allow publishing a record in the clear; use a delta "
                        f"well below 1/n (or {allow_name})")
    if delta > 1.0 / (10 * n):
        warnings.warn(f"delta {delta:g} is above 1/(10 n), n the number of private records; a "
                      "delta well below 1/n is the usual choice", stacklevel=2)
