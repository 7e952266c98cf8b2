"""The aggregation service over HTTP: a real ``pate serve`` (uvicorn) on loopback per mechanism;
mechanisms against their definitions, authentication, validation of every input, budget
exhaustion, idempotent retries, and inputs mode with a stand-in ensemble."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from service_common import votes_for_ledger
from service_harness import TOKENS, Server, auth, serving, write_tokens

from analysis.mechanisms import GNMax
from analysis.orders import default_orders
from analysis.threshold import threshold_logpr_answered
from pate.aggregation.aggregators import Aggregator
from pate.aggregation.label_requests import Limits, encode_inputs
from pate.aggregation.label_service import InProcessLabels, LabelService, open_label_service
from pate.aggregation.ledger import Ledger
from pate.aggregation.vote_pool import VotePool
from pate.cli.main import main
from pate.data.synthetic import dirichlet_votes
from pate.errors import (
    AuthenticationError,
    BatchTooLarge,
    BudgetExhausted,
    LedgerError,
    RequestConflict,
    UserError,
)
from pate.service.app import create_app
from pate.service.client import LabelClient
from pate.service.server import LabelServer, open_server
from pate.service.tokens import TokenStore

POOL_OFFSET = 1000  # pool indices are not row numbers
ROWS = 1200


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("service")
    votes = dirichlet_votes(ROWS, strict=True)
    # rows 0-399 far above T=200, 400-799 exactly at T, 800-1199 far below
    votes[:400] = 0
    votes[:400, 0] = 250
    votes[400:800] = 0
    votes[400:800, 1], votes[400:800, 2] = 200, 50
    votes[800:] = 25
    votes[800:, 3] = 25 + 0  # keep 10 classes summing to 250: all 25
    np.savez(d / "votes.npz", votes=votes, pool_index=np.arange(ROWS) + POOL_OFFSET)
    np.save(d / "plurality.npy", dirichlet_votes(ROWS, seed=4, strict=True))
    write_tokens(d / "tokens.txt")
    return d


def base_args(d: Path, *mech: str, budget: str = "1e15", votes: str = "votes.npz",
              extra: tuple[str, ...] = ()) -> list[str]:
    ledger = f"sqlite:///{d / ('ledger-' + '-'.join(mech).replace('--', '')) }.db"
    return ["--votes", str(votes_for_ledger(d / votes, ledger)), *mech, "--budget-epsilon",
            budget, "--delta", "1e-5", "--token-file", str(d / "tokens.txt"), "--ledger",
            ledger, *extra]


@pytest.fixture(scope="module")
def confident(workdir: Path) -> Iterator[Server]:
    with serving(base_args(workdir, "--mechanism", "confident", "--threshold", "200",
                           "--sigma1", "20", "--sigma2", "1e-3",
                           extra=("--max-batch", "500", "--max-body-bytes", "65536")),
                 workdir) as server:
        yield server


def post(server: Server, body: object, token: str = TOKENS[0], **kw: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/labels", json=body, headers=auth(token), timeout=30,
                      **kw)


def ask(server: Server, indices: list[int], rid: str, token: str = TOKENS[0]) -> dict:
    r = post(server, {"request_id": rid, "indices": indices}, token)
    assert r.status_code == 200, r.text
    return r.json()


def test_banner_says_where_and_the_basis(confident: Server) -> None:
    assert "listening on http://127.0.0.1:" in confident.banner
    assert "basis: data-independent RDP" in confident.banner
    schema = httpx.get(confident.url + "/openapi.json")
    assert schema.status_code == 200 and "LabelsRequest" in schema.text
    assert httpx.get(confident.url + "/docs").status_code == 404  # off: it needs a CDN
    spec = httpx.get(confident.url + "/openapi.json").json()
    assert {"/v1/labels", "/v1/budget", "/v1/mechanism", "/healthz"} <= set(spec["paths"])
    mechanism = confident.url + "/v1/mechanism"  # public parameters, to a token holder
    assert httpx.get(mechanism).status_code == 401
    with LabelClient(confident.url, TOKENS[0]) as client:
        assert client.mechanism() == httpx.get(mechanism, headers=auth()).json() == {
            "mechanism": "confident", "threshold": 200.0, "sigma1": 20.0, "sigma2": 1e-3}


def test_confident_answers_at_the_predicted_rates(confident: Server) -> None:
    labels = np.concatenate([
        ask(confident, list(range(POOL_OFFSET + k, POOL_OFFSET + k + 400)), f"rate-{k}")["labels"]
        for k in (0, 400, 800)])
    predicted = np.exp(threshold_logpr_answered(200.0, 20.0, [250, 200, 25]))
    for k, p in enumerate(predicted):
        rate = (labels[400 * k:400 * (k + 1)] >= 0).mean()
        assert abs(rate - p) <= 5 * np.sqrt(p * (1 - p) / 400) + 1e-3, (k, rate, p)
    answered = labels[:800][labels[:800] >= 0]
    assert set(answered.tolist()) <= {0, 1}  # sigma2 -> 0: the plurality of each block


@pytest.mark.parametrize(("mech", "spread"), [
    (("--mechanism", "gnmax", "--sigma", "1e-3"), False),
    (("--mechanism", "lnmax", "--scale", "0.02"), False),
    (("--mechanism", "gnmax", "--sigma", "1e7"), True),
])
def test_noise_limits(workdir: Path, mech: tuple[str, ...], spread: bool) -> None:
    votes = np.load(workdir / "plurality.npy")
    with serving(base_args(workdir, *mech, votes="plurality.npy"), workdir) as server:
        labels = np.array(ask(server, list(range(ROWS)), "all")["labels"])
    if spread:
        counts = np.bincount(labels, minlength=10)
        assert counts.min() > 60 and counts.max() < 190  # ~120 each of 1200
    else:
        np.testing.assert_array_equal(labels, np.argmax(votes, axis=1))


def test_interactive_branches(workdir: Path) -> None:
    mech = ("--mechanism", "interactive", "--threshold", "150", "--sigma1", "1e-3",
            "--sigma2", "1e-3", "--gamma", "0.8")
    with serving(base_args(workdir, *mech), workdir) as server:
        probs = np.zeros((3, 10))
        probs[0, 5] = 1.0                  # row 1000: 250 for class 0 -> teachers (250 >= T)
        probs[1, 1], probs[1, 7] = 0.5, 0.5  # row 1400: 200 - 125 < T; student unsure -> none
        probs[2, 9] = 1.0                  # row 1800: 25 - 0 < T; student sure -> student
        r = post(server, {"request_id": "i1", "indices": [1000, 1400, 1800],
                          "student_probs": probs.tolist()})
        assert r.status_code == 200, r.text
        assert r.json()["labels"] == [0, -1, 9]
        assert r.json()["branch"] == ["teachers", "none", "student"]
        assert post(server, {"request_id": "i2", "indices": [1000]}).status_code == 422
        for bad in ([[0.5] * 10], [[float("nan")] + [0.1] * 9], [[1.0] * 10],
                    [[-0.5, 1.5] + [0.0] * 8], [[0.1] * 9]):
            body = json.dumps({"request_id": "i3", "indices": [1001], "student_probs": bad})
            r = httpx.post(server.url + "/v1/labels", content=body,  # NaN: not strict JSON
                           headers={**auth(), "Content-Type": "application/json"})
            assert r.status_code == 422, (bad, r.text)
        assert post(server, {"request_id": "i4", "indices": [1001],
                             "student_probs": [[0.1] * 10]}).status_code == 200


def test_authentication_and_revocation(workdir: Path) -> None:
    tokens = workdir / "revocable.txt"
    write_tokens(tokens)
    args = base_args(workdir, "--mechanism", "gnmax", "--sigma", "10")
    args[args.index("--token-file") + 1] = str(tokens)
    with serving(args, workdir) as server:
        url = server.url + "/v1/budget"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers=auth("wrong")).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Basic " + TOKENS[0]}).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer"}).status_code == 401
        r = post(server, {"request_id": "x", "indices": [1000]}, token="wrong")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url, headers=auth(TOKENS[1])).status_code == 200
        tokens.write_text(TOKENS[0] + "\n")  # revoke the second token
        assert httpx.get(url, headers=auth(TOKENS[1])).status_code == 401
        assert httpx.get(url, headers=auth(TOKENS[0])).status_code == 200
        assert httpx.get(server.url + "/healthz").status_code == 200
        with LabelClient(server.url, TOKENS[1]) as client, pytest.raises(AuthenticationError):
            client.budget()


BAD_BODIES: list[tuple[str, object, int]] = [
    ("not json", b"{\"request_id\": ", 400),
    ("not an object", [1, 2], 422),
    ("no request_id", {"indices": [1000]}, 422),
    ("bad request_id", {"request_id": "a b", "indices": [1000]}, 422),
    ("long request_id", {"request_id": "a" * 200, "indices": [1000]}, 422),
    ("neither source", {"request_id": "b1"}, 422),
    ("both sources", {"request_id": "b1", "indices": [1000],
                      "inputs": {"dtype": "float32", "shape": [1, 1], "data": ""}}, 422),
    ("empty batch", {"request_id": "b1", "indices": []}, 422),
    ("unknown index", {"request_id": "b1", "indices": [5]}, 422),
    ("past the pool", {"request_id": "b1", "indices": [POOL_OFFSET + ROWS]}, 422),
    ("negative index", {"request_id": "b1", "indices": [-1]}, 422),
    ("huge index", {"request_id": "b1", "indices": [10**30]}, 422),
    ("duplicates", {"request_id": "b1", "indices": [1000, 1001, 1000]}, 422),
    ("string index", {"request_id": "b1", "indices": ["1000"]}, 422),
    ("float index", {"request_id": "b1", "indices": [1000.5]}, 422),
    ("extra field", {"request_id": "b1", "indices": [1000], "sigma": 0}, 422),
    ("probs for confident", {"request_id": "b1", "indices": [1000],
                             "student_probs": [[1.0] + [0.0] * 9]}, 422),
    ("inputs without ensemble", {"request_id": "b1", "inputs": {
        "dtype": "float32", "shape": [1, 1, 1, 1], "data": "AAAAAA=="}}, 422),
    ("batch too large", {"request_id": "b1", "indices": list(range(1000, 1501))}, 413),
    ("body too large", {"request_id": "b1", "indices": [1000], "pad": "x" * 70000}, 413),
]


@pytest.mark.parametrize(("name", "body", "status"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_gets_its_4xx_and_the_server_keeps_serving(
        confident: Server, name: str, body: object, status: int) -> None:
    if isinstance(body, bytes):
        r = httpx.post(confident.url + "/v1/labels", content=body,
                       headers={**auth(), "Content-Type": "application/json"})
    else:
        r = post(confident, body)
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"error", "detail"}
    assert ask(confident, [1000], f"after-{name.replace(' ', '-')}")["answered"] in (0, 1)


def test_a_chunked_body_over_the_limit_is_refused(confident: Server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"request_id": "chunked", "indices": [1000], "pad": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}'
    r = httpx.post(confident.url + "/v1/labels", content=chunks(),
                   headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"


def test_unknown_routes_answer_json(confident: Server) -> None:
    r = httpx.get(confident.url + "/v1/nothing", headers=auth())
    assert r.status_code == 404 and set(r.json()) == {"error", "detail"}
    r = httpx.get(confident.url + "/v1/labels", headers=auth())
    assert r.status_code == 405 and set(r.json()) == {"error", "detail"}
    r = httpx.get(confident.url + "/v1/budget/", headers=auth())  # no bare redirect either
    assert r.status_code == 404 and set(r.json()) == {"error", "detail"}


def test_retries_are_idempotent(confident: Server) -> None:
    ask(confident, list(range(1400, 1405)), "retry-0")  # released before, but asked afresh:
    body = {"request_id": "retry-1", "indices": list(range(1400, 1420)), "fresh": True}
    first = post(confident, body).json()
    again = post(confident, body).json()  # the stored answer, as first sent: nothing replayed
    assert first["replayed"] == again["replayed"] == [False] * 20
    assert again["labels"] == first["labels"] and not first["retried"] and again["retried"]
    assert again["budget"]["queries"] == first["budget"]["queries"]
    r = post(confident, {"request_id": "retry-1", "indices": list(range(1400, 1421))})
    assert r.status_code == 409 and r.json()["error"] == "request_id_conflict"


def test_a_round_asks_in_requests_the_service_takes(workdir: Path) -> None:
    """A round asking more per request than the service's batch limit (413, refused before
    anything is asked or spent) asks again in halves, as it does at the budget."""
    from student.rounds import ask as ask_round

    args = base_args(workdir, "--mechanism", "gnmax", "--sigma", "0.0016",  # its own ledger
                     extra=("--max-batch", "16"))
    with serving(args, workdir) as server, LabelClient(server.url, TOKENS[0]) as client:
        sizes: list[int] = []
        got, exhausted = ask_round(client, np.arange(50) + POOL_OFFSET, request_size=40,
                                   on_request=lambda received: sizes.append(len(received)))
        assert not exhausted and got.pool_index.tolist() == list(range(1000, 1050))
        assert sizes == [10, 20, 30, 40, 50] and client.budget()["queries"] == 50


def test_budget_exhaustion_refuses_and_spends_nothing(workdir: Path) -> None:
    args = base_args(workdir, "--mechanism", "gnmax", "--sigma", "20", budget="1.0")
    with serving(args, workdir) as server, LabelClient(server.url, TOKENS[0]) as client:
        answers = {}
        with pytest.raises(BudgetExhausted):  # loop until refused
            for i in range(1000):
                answers[f"b{i}"] = client.labels([1000 + i], request_id=f"b{i}")
        before = client.budget()
        assert 0 < before["epsilon_spent"] <= before["epsilon_budget"] == 1.0
        assert before["queries"] == len(answers)
        for i in range(3):
            with pytest.raises(BudgetExhausted) as info:
                client.labels([1999 - i], request_id=f"late{i}")
            assert info.value.status == 403
        assert client.budget() == before
        released = client.labels([1000], request_id="again")  # a release replays, free
        assert released.replayed.all() and released.labels.tolist() == answers["b0"].labels.tolist()
        assert client.budget() == before
        replay = client.labels([1000], request_id="b0")  # stored answers stay available
        assert replay.labels.tolist() == answers["b0"].labels.tolist()
        assert client.budget() == before
        with pytest.raises(RequestConflict) as conflict:
            client.labels([1001], request_id="b0")
        assert conflict.value.status == 409


# -- inputs mode, with a stand-in for teachers.votes' ensemble --------------------------------


class PlainEnsemble:
    """Votes of 5 teachers: all vote for the class given by the image's first pixel."""

    in_shape = (1, 2, 2)

    def vote(self, x: np.ndarray) -> np.ndarray:
        assert x.dtype == np.float32 and x.shape[1:] == self.in_shape
        votes = np.zeros((len(x), 3), np.int32)
        votes[np.arange(len(x)), x[:, 0, 0, 0].astype(int) % 3] = 5
        return votes


@pytest.fixture(scope="module")
def inputs_server(workdir: Path) -> Iterator[str]:
    aggregator = Aggregator(GNMax(sigma=1e-3))
    ledger = Ledger(f"sqlite:///{workdir / 'inputs-ledger.db'}", aggregator.orders, 1e-5, 1e15)
    service = LabelService(aggregator, ledger, None, PlainEnsemble(), Limits(64, 65536))
    server = LabelServer(service, TokenStore(workdir / "tokens.txt"),
                         socket.create_server(("127.0.0.1", 0)))
    with server.running() as url:
        yield url
    server.close()


def test_inputs_mode_votes_on_new_images(inputs_server: str) -> None:
    x = np.zeros((6, 1, 2, 2), np.float32)
    x[:, 0, 0, 0] = [0, 1, 2, 3, 4, 5]
    with LabelClient(inputs_server, TOKENS[0]) as client:
        assert client.labels(inputs=x).labels.tolist() == [0, 1, 2, 0, 1, 2]
        with pytest.raises(UserError) as info:
            client.labels(indices=[0])
        assert info.value.status == 422


INPUTS_BAD: list[tuple[str, dict, int]] = [
    ("not base64", {"dtype": "float32", "shape": [1, 1, 2, 2], "data": "@@@@"}, 400),
    ("wrong dtype", {"dtype": "float64", "shape": [1, 1, 2, 2], "data": ""}, 422),
    ("wrong rank", {"dtype": "float32", "shape": [1, 4], "data": ""}, 422),
    ("wrong image shape", {**encode_inputs(np.zeros((1, 1, 3, 3)))}, 422),
    ("short data", {"dtype": "float32", "shape": [2, 1, 2, 2],
                    "data": base64.b64encode(b"\0" * 16).decode()}, 422),
    ("nan", encode_inputs(np.full((1, 1, 2, 2), np.nan)), 422),
    ("inf", encode_inputs(np.full((1, 1, 2, 2), np.inf)), 422),
    ("zero batch", {"dtype": "float32", "shape": [0, 1, 2, 2], "data": ""}, 422),
    ("batch too large", encode_inputs(np.zeros((65, 1, 2, 2))), 413),
]


@pytest.mark.parametrize(("name", "inputs", "status"), INPUTS_BAD, ids=[b[0] for b in INPUTS_BAD])
def test_bad_inputs_get_their_4xx(inputs_server: str, name: str, inputs: dict,
                                  status: int) -> None:
    r = httpx.post(inputs_server + "/v1/labels", headers=auth(),
                   json={"request_id": "bad", "inputs": inputs})
    assert r.status_code == status, r.text
    ok = httpx.post(inputs_server + "/v1/labels", headers=auth(),
                    json={"request_id": f"ok-{name.replace(' ', '-')}",
                          "inputs": encode_inputs(np.ones((1, 1, 2, 2)))})
    assert ok.status_code == 200 and ok.json()["labels"] == [1]


def test_votes_pool_rejects_a_repeated_pool_index() -> None:
    with pytest.raises(UserError, match="repeated"):
        VotePool(np.ones((2, 3)), np.array([4, 4]))


def test_in_process_client_shares_the_rules(workdir: Path) -> None:
    service = open_label_service(GNMax(sigma=1e-3), epsilon_budget=1e15,
                                 delta=1e-5, votes_path=workdir / "plurality.npy",
                                 ledger=f"sqlite:///{workdir / 'local.db'}")
    with InProcessLabels(service) as client:
        first = client.labels([0, 1, 2], request_id="local-1")
        votes = np.load(workdir / "plurality.npy")
        assert first.labels.tolist() == np.argmax(votes[:3], axis=1).tolist()
        assert client.labels([0, 1, 2], request_id="local-1").labels.tolist() == \
            first.labels.tolist()
        assert client.budget()["queries"] == 3
        with pytest.raises(RequestConflict) as info:
            client.labels([0, 1], request_id="local-1")
        assert info.value.status == 409
        with pytest.raises(UserError, match=r"not in the registered pool: \[5000\]") as info:
            client.labels([5000])
        assert (info.value.status, info.value.error) == (422, "invalid_request")
        with pytest.raises(UserError, match="exactly one of 'indices' and 'inputs'") as info:
            client.labels(None)  # the schema's check, as over HTTP
        assert info.value.detail[0]["msg"].endswith("give exactly one of 'indices' and 'inputs'")
        with pytest.raises(UserError, match="only for the interactive mechanism"):
            client.labels([3], student_probs=[[0.1] * 10])
        with pytest.raises(BatchTooLarge):
            client.labels(np.arange(4097))
        assert client.budget()["queries"] == 3


@pytest.mark.parametrize(("change", "message"), [
    ({"--sigma": None}, "--sigma must be given"),
    ({"--token-file": "missing.txt"}, "cannot read the token file"),
    ({"--votes": "missing.npy"}, "no such file"),
    ({"--delta": "2"}, "delta must be in (0, 1)"),
])
def test_serve_reports_user_errors_in_one_line(workdir: Path, change: dict, message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = base_args(workdir, "--mechanism", "gnmax", "--sigma", "10", votes="plurality.npy")
    for flag, value in change.items():
        i = args.index(flag)
        if value is None:
            del args[i:i + 2]
        else:
            args[i + 1] = str(workdir / value) if value.endswith((".txt", ".npy")) else value
    assert main(["serve", *args, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_serve_refuses_a_ledger_of_other_settings_in_one_line(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = f"sqlite:///{workdir / 'settled.db'}"
    Ledger(ledger, default_orders(), 1e-5, 5.0).close()
    args = base_args(workdir, "--mechanism", "gnmax", "--sigma", "10", votes="plurality.npy")
    args[args.index("--ledger") + 1] = ledger
    args[args.index("--votes") + 1] = str(votes_for_ledger(workdir / "plurality.npy", ledger))
    assert main(["serve", *args, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pate: error: the ledger was created with epsilon_budget 5.0;")
    assert "it has charged nothing" in err and err.count("\n") == 1


def test_inputs_retries_replay_and_conflict(inputs_server: str) -> None:
    x = np.full((2, 1, 2, 2), 2.0, np.float32)
    with LabelClient(inputs_server, TOKENS[0]) as client:
        first = client.labels(inputs=x, request_id="inputs-retry")
        assert client.labels(inputs=x, request_id="inputs-retry").labels.tolist() == \
            first.labels.tolist()
        with pytest.raises(RequestConflict) as info:
            client.labels(inputs=x[:1], request_id="inputs-retry")
        assert info.value.status == 409


def test_pool_indices_of_any_size_are_replayed(tmp_path: Path) -> None:
    """A votes file's pool_index may hold any int64: a released answer is replayed, free, to
    this service and to a second one on the same ledger (which learns it from the ledger)."""
    votes = np.array([[9, 1, 0], [0, 10, 0], [1, 0, 9]])
    np.savez(tmp_path / "votes.npz", votes=votes, pool_index=np.array([10**12, 7, 3]))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"

    def service() -> LabelService:
        return open_label_service(GNMax(sigma=1e-3), epsilon_budget=1e15, delta=1e-5,
                                  votes_path=tmp_path / "votes.npz", ledger=url)

    with InProcessLabels(service()) as client:
        first = client.labels([10**12, 7])
        assert first.labels.tolist() == [0, 1]
        assert client.labels([7, 3, 10**12]).labels.tolist() == [1, 2, 0]
        assert client.budget()["queries"] == 3  # the two asked again were replayed, free
    with InProcessLabels(service()) as again:
        assert again.labels([3, 10**12]).labels.tolist() == [2, 0]
        assert again.budget()["queries"] == 3


def test_a_server_in_this_process_leaves_its_logging_alone(tmp_path: Path) -> None:
    """``pate run`` and a Python caller serve in their own process: starting the server must
    not close the process's logging handlers (uvicorn's logging configuration would)."""
    class Probe(logging.Handler):
        closed = False

        def emit(self, record: logging.LogRecord) -> None:
            pass

        def close(self) -> None:
            self.closed = True
            super().close()

    probe = Probe()
    logging.getLogger("a-caller").addHandler(probe)
    np.savez(tmp_path / "votes.npz", votes=dirichlet_votes(20, strict=True))
    server = open_server(GNMax(sigma=10.0), token_file=write_tokens(tmp_path / "tokens"),
                         epsilon_budget=50.0, delta=1e-5, votes_path=tmp_path / "votes.npz",
                         port=0)
    try:
        with server.running() as url:
            assert httpx.get(f"{url}/healthz").status_code == 200
    finally:
        server.close()
        logging.getLogger("a-caller").removeHandler(probe)
    assert not probe.closed


def test_a_failure_anywhere_answers_a_fixed_500_and_logs_its_class_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever fails while a route works (the pool's description, the mechanism, reading a
    request; a ``PateError`` of status 500 raised outside the routes' own guards too), the
    client gets the fixed JSON 500 and the log the exception's class: never its message, which
    may carry private values."""
    np.savez(tmp_path / "votes.npz", votes=dirichlet_votes(20, strict=True))
    server = open_server(GNMax(sigma=10.0), token_file=write_tokens(tmp_path / "tokens"),
                         epsilon_budget=50.0, delta=1e-5, votes_path=tmp_path / "votes.npz",
                         port=0)

    def leak(*_args: object) -> None:
        raise RuntimeError("votes=[250, 0, 0] of the private rows")

    def leak_refusal(*_args: object) -> None:
        raise LedgerError("votes=[250, 0, 0] of the private rows")

    try:
        with server.running() as url, caplog.at_level(logging.INFO):
            for name, route, fault in (("describe_pool", "GET /v1/pool", leak),
                                       ("mechanism", "GET /v1/mechanism", leak_refusal),
                                       ("parse", "POST /v1/labels", leak)):
                setattr(server.service, name, fault)
                method, path = route.split()
                got = httpx.request(method, f"{url}{path}", headers=auth(TOKENS[0]),
                                    json={"request_id": "r1", "indices": [0]})
                assert (got.status_code, got.json()["error"]) == (500, "internal_error"), route
                assert "votes" not in got.text and "private" not in got.text
            assert httpx.get(f"{url}/healthz").status_code == 200  # still serving
    finally:
        server.close()
    logged = caplog.text
    assert "RuntimeError" in logged and "LedgerError" in logged
    assert "votes=" not in logged


def test_a_500_raised_outside_every_guard_answers_the_fixed_detail(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The application's own handler: a ``PateError`` of status 500 that no route guarded (a
    route added later, say) answers the fixed detail and is logged by its class, never by its
    message."""
    np.savez(tmp_path / "votes.npz", votes=dirichlet_votes(20, strict=True))
    service = open_label_service(GNMax(sigma=10.0), epsilon_budget=50.0, delta=1e-5,
                                 votes_path=tmp_path / "votes.npz")
    app = create_app(service, TokenStore(write_tokens(tmp_path / "tokens")))

    @app.get("/unguarded")
    def unguarded() -> None:
        raise LedgerError("votes=[250, 0, 0] of the private rows")

    async def ask_it() -> httpx.Response:  # the application itself, over ASGI
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://pate") as client:
            return await client.get("/unguarded")

    with caplog.at_level(logging.INFO):
        got = asyncio.run(ask_it())
    service.close()
    assert (got.status_code, got.json()) == (500, {"error": "internal_error",
                                                   "detail": "internal error: nothing released"})
    assert "LedgerError" in caplog.text and "votes=" not in caplog.text
