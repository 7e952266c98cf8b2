"""Which ledger charges which votes: one body of private data has one budget (docs/design.md,
privacy rule 5).

A votes file's first ledger is theirs for good, recorded in ``ledger-url.txt`` beside them
(``ledger_of_votes``, ``recorded_ledger``); every ledger that charges votes is entered in the
user's registry under the private data's fingerprints, and one new beside others is warned of
(``note_ledger``, ``budget_registry``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path

from pate.aggregation.budget_registry import enter_ledger, ledgers_said, other_ledgers
from pate.aggregation.ledger_store import canonical_url, ledger_url, stored_settings
from pate.data.votes_file import load_private_keys
from pate.errors import UserError
from pate.rundir import LEDGER_FILE, LEDGER_RECORD, RunDir

# what a refusal of a spent budget says of a way out: none, as a new ledger would be a second
# budget for the same data (docs/design.md, privacy rule 5)
BUDGET_SPENT_HINT = ("this private data's budget is spent: one body of private data has one "
                     "budget, and a new ledger for it would be a second")


def note_ledger(private_fingerprint: str | None, url: str,
                former_fingerprint: str | None = None,
                rows_fingerprints: Iterable[str | None] = ()) -> None:
    """Enter the ledger at ``url`` in the registry of the ledgers of the private data whose
    fingerprint the votes record (``budget_registry``; nothing where none is known), and under
    ``rows_fingerprints``, the keys of its rows in any order and format
    (``Task.private_rows_fingerprint``) and as encoded
    (``Task.private_encoded_rows_fingerprint``), where known (None: not); warn when it is new
    under a key while other ledgers charge the same data: their budgets add up (docs/design.md,
    privacy rule 5). Those older versions entered under ``former_fingerprint`` (the rows' in
    order) count as others too. A ledger new only under a rows' key (a run of a version before
    that key) warns only where the keys new to it find ledgers the others had not: of those,
    it warned then."""
    if private_fingerprint is None:
        return
    url = canonical_url(url)
    first, new = enter_ledger(private_fingerprint, url)
    seen = first + other_ledgers((former_fingerprint,), url)  # under keys it had before
    fresh: list[str] = []  # under rows' keys new to it
    for key in dict.fromkeys(k for k in rows_fingerprints if k is not None):
        found, new_here = enter_ledger(key, url)
        (fresh if new_here else seen).extend(found)
    others = list(dict.fromkeys(seen + fresh))
    new = new or bool(set(fresh) - set(seen))
    if new and others:
        warnings.warn(f"the private data of these votes is also charged to {len(others)} "
                      f"other ledger(s) ({ledgers_said(others)}): the budgets of one body of "
                      "private data add up; to share one, give it as aggregator.ledger "
                      "(--ledger, ledger=)", stacklevel=3)


def recorded_ledger(home: Path) -> str | None:
    """The URL of the ledger that charges the votes in ``home`` (a run directory, or a votes
    file's folder), as ``home/ledger-url.txt`` records it (a URL's password is not kept); where
    nothing is recorded (votes charged before ledgers were), their own ``ledger.db`` if it is
    there; else None."""
    own = canonical_url(f"sqlite:///{home / LEDGER_FILE}")
    record = home / LEDGER_RECORD
    if record.is_file():
        text = record.read_text(encoding="utf-8").strip()
        return own if text == LEDGER_FILE else text
    return own if (home / LEDGER_FILE).is_file() else None


def ledgers_beside(home: Path) -> list[str]:
    """The ledgers other than :func:`recorded_ledger`'s that charge the private data of the
    votes in ``home`` (``home/votes.npz``), as this user's registry holds them
    (``budget_registry``): their budgets add up with this one's; empty without votes or a
    ledger. The URLs are the owner's (paths, hosts): not for a publishable page."""
    url, votes = recorded_ledger(home), RunDir(home).votes
    if url is None or not votes.is_file():
        return []
    return other_ledgers(load_private_keys(votes), canonical_url(url))


def ledger_of_votes(home: Path, ledger: str | Path | None, charged_before: bool
                     ) -> tuple[str, str | None]:
    """The ledger for the votes in ``home`` (a run directory, or a votes file's folder) and
    what to record of it, if it must be: one budget per body of private data, so the votes'
    first ledger is theirs for good, recorded in ``home/ledger-url.txt`` when first opened:
    ``ledger.db`` for their own SQLite file beside them (the default; it moves with them),
    else its URL, password hidden. Refused (``UserError``): another ledger than the one they
    have, and a ledger that is not there where one was recorded or answers were charged
    before (a new one would be a second budget)."""
    own = canonical_url(f"sqlite:///{home / LEDGER_FILE}")
    url = own if ledger is None else ledger_url(ledger)
    named = canonical_url(url)
    record = home / LEDGER_RECORD
    bound = recorded_ledger(home)
    if bound is not None and bound != named:
        raise UserError(f"{bound} already charges these votes: another ledger ({named}) would "
                        "give the same private data a second budget; use that one (or move it "
                        "away, knowing what it spent)")
    if (record.is_file() or charged_before) and stored_settings(url) is None:
        if record.is_file():
            raise UserError(f"the ledger that charged these votes ({bound}) is not there: "
                            "restore it (a new one would give the same private data a second "
                            "budget)")
        raise UserError(f"answers received before were charged to a ledger that is not at "
                        f"{named}: restore it (a new one would give the same private data a "
                        "second budget)")
    return url, None if record.is_file() else (LEDGER_FILE if named == own else named)
