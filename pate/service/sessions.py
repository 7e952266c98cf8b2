"""The aggregator a student's round asks (``student.asking.AggregatorSession``): a running
``pate serve`` over HTTP, or the label service in this process over a votes file (``pate
student train --votes``, and ``--run``'s own votes), with its ledger."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from analysis.mechanisms import Mechanism
from analysis.rdp import Conversion
from pate.aggregation.label_service import InProcessLabels, open_label_service
from pate.aggregation.vote_pool import VotePool
from pate.errors import UserError
from pate.rundir import RunDir
from pate.service.client import LabelClient, said_url
from student.asking import AggregatorSession


def remote_session(server: str, token_file: str | Path, mechanism: str) -> AggregatorSession:
    """The HTTP client of the ``pate serve`` at ``server``, with the first token of
    ``token_file``, checked to answer before the round starts (rather than after the retries
    of its first request)."""
    if not server.strip():  # an unset variable, say
        raise UserError("--server is empty: give a pate serve's address, http://HOST:PORT")
    try:
        client = LabelClient.from_token_file(server, token_file)
    except (OSError, UnicodeDecodeError) as exc:  # said as pate serve says it of its own
        raise UserError(f"{token_file}: cannot read the token file "
                        f"({exc.__class__.__name__})") from None
    except ValueError as exc:
        raise UserError(f"{token_file}: {exc}") from None
    if not client.healthy():
        client.close()
        hint = (" (give the server's address without /v1: the routes are added to it)"
                if server.rstrip("/").endswith("/v1") else "")
        raise UserError(f"cannot reach {said_url(server)}: is a pate serve running there?"
                        f"{hint}")
    return AggregatorSession(client, mechanism)


def local_session(run: RunDir, mechanism: Mechanism, votes: Path | None, *,
                  epsilon_budget: float, delta: float, ledger: str | None,
                  conversion: Conversion, check_votes: Callable[[VotePool], None],
                  allow_large_delta: bool, release_sanitised: bool = True) -> AggregatorSession:
    """The label service in this process over ``votes`` (default the run's), which
    ``check_votes`` sees before the ledger opens; the ledger must exist where the run holds
    answers already (a new one would be a second budget), and delta is checked against the
    run's private records (``open_label_service``); ``release_sanitised``: whether the round
    releases the sanitised epsilon of the answers (``AggregatorSession``)."""
    votes = votes or run.votes
    if not votes.is_file():
        raise UserError(f"{votes}: no votes file (give --votes FILE or --server URL)")
    service = open_label_service(mechanism, epsilon_budget=epsilon_budget, delta=delta,
                                 votes_path=votes, ledger=ledger, conversion=conversion,
                                 check_pool=check_votes, charged_before=run.labels.is_file(),
                                 private_records=run.private_records(),
                                 allow_large_delta=allow_large_delta)
    return AggregatorSession(InProcessLabels(service), mechanism.name, service,
                             release_sanitised)
