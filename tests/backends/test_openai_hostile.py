"""The openai backend against a hostile server (issue 40, points 2, 10 and 15): a real HTTP
server on 127.0.0.1 that echoes the API key back, answers what cannot be true, or sends more
than any request needs. The key is in no file and on no terminal line; impossible answers fail
their setup with a clear reason and are never stored as results; a key is never sent in clear
to another machine unless the config says so, and that refusal opens no connection."""

from __future__ import annotations

import html
import http.server
import json
import math
import socket
import threading
import tracemalloc
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from qeval.backends.base import TOPK
from qeval.backends.openai import metrics, scoring
from qeval.backends.openai.backend import MAX_VERSION_CHARS, _server_version, token_chars
from qeval.backends.openai.client import REDACTED, BadAnswer, Client, ServerError, TooLarge, Unreachable
from qeval.config.server import ServerSpec
from qeval.errors import UserError
from tests.helpers import MODEL, make_config, run_cli

KEY = "sk-qeval-hostile-7f3a9c1e5b"
KEY_ENV = "QEVAL_HOSTILE_KEY"

#: what the server answers: (method, path, request headers, decoded JSON body or None) -> (status, body
#: bytes, extra headers); a body of None streams `Handler.stream` instead
Route = Callable[[str, str, dict[str, str], Any], tuple[int, bytes | None, dict[str, str]]]


class Handler(http.server.BaseHTTPRequestHandler):
    route: Route
    stream: Callable[[], Iterator[bytes]] = staticmethod(lambda: iter(()))
    protocol_version = "HTTP/1.0"  # a body without Content-Length ends when the connection closes

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        status, data, headers = type(self).route(method, self.path, dict(self.headers), body)
        self.send_response(status)
        for k, v in ({"Content-Type": "application/json"} | headers).items():
            self.send_header(k, v)
        if data is not None:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            if data is not None:
                self.wfile.write(data)
            else:
                for piece in type(self).stream():
                    self.wfile.write(piece)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: what it should do
            pass

    def do_GET(self) -> None:  # http.server's name
        self._answer("GET")

    def do_POST(self) -> None:  # http.server's name
        self._answer("POST")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    """A server on 127.0.0.1 answering Handler.route; its /v1 base URL."""
    Handler.route = staticmethod(lambda *a: (200, b"{}", {}))
    Handler.stream = staticmethod(lambda: iter(()))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _route(fn: Route) -> None:
    Handler.route = staticmethod(fn)


def _json(data: Any) -> bytes:
    return json.dumps(data).encode()


def _logprob_answer(prompt: list[int], lp: float = -1.0) -> dict[str, Any]:
    """A plausible prompt_logprobs answer: the actual token first (log-prob `lp`), 15 others after."""
    rows: list[Any] = [None]
    for tok in prompt[1:]:
        others = [t for t in range(200) if t != tok][: TOPK - 1]
        row = {str(tok): {"logprob": lp, "rank": 1}}
        row |= {str(t): {"logprob": -5.0 - r, "rank": r + 2} for r, t in enumerate(others)}
        rows.append(row)
    return {"choices": [{"text": "x", "prompt_logprobs": rows}], "usage": {"completion_tokens": 1}}


# -- point 2: the key the server echoes back -----------------------------------------------------------


def _echo_key(method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, bytes | None, dict[str, str]]:
    """/health and /version answer; every completion is refused with the request's headers in the body."""
    if path.endswith("/health"):
        return 200, b"", {}
    if path.endswith("/version"):
        return 200, _json({"version": "0.32.0"}), {}
    auth = headers.get("Authorization", "")
    return 400, _json({"error": {"message": f"bad request; you sent Authorization: {auth!r} ({auth})"}}), {}


def _all_bytes(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_key_the_server_echoes_reaches_no_file_and_no_terminal(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 400 with the Authorization header in its body: at the pre-run check (a likelihood task)
    the refusal is one line without the key; in a run of a generation task the setup fails with
    the server's message, the key replaced, in results.json, the reports, setups/<setup>.json and
    MLflow's records alike."""
    _route(_echo_key)
    monkeypatch.setenv(KEY_ENV, KEY)
    srv = {"mode": "attach", "base_url": server, "model": "m", "api_key_env": KEY_ENV, "retries": 0}
    cfg = make_config(
        tmp_path,
        setups=[{"name": "bf16", "baseline": True}],
        backend="openai",
        server=srv,
        tasks=["addition", "compare_mc"],
        gates=[],
        tracking={"mlflow": {"tracking_uri": (tmp_path / "mlruns").as_uri(), "experiment": "e"}},
    )
    res = run_cli("validate", str(cfg), timeout=300)
    assert res.returncode == 2 and REDACTED in res.stderr, res.stderr[-2000:]  # the server's message was shown
    assert KEY not in res.stderr + res.stdout

    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), "--tasks", "addition", "--limit", "2", timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    setup = json.loads((out / "results.json").read_text())["setups"][0]
    assert setup["status"] == "failed" and "HTTP 400" in setup["error"] and REDACTED in setup["error"], setup
    files = _all_bytes(tmp_path)
    assert {p.name for p in files} >= {"results.json", "report.md", "report.html", "bf16.json"}
    assert any(b"HTTP 400" in data for p, data in files.items() if "mlruns" in p.parts), "no MLflow record of it"
    leaks = [str(p) for p, data in files.items() if KEY.encode() in data]
    assert not leaks and KEY not in res.stderr + res.stdout, leaks


#: a key with the characters URL-encoding, HTML and JSON escape (base64 keys have / + =)
ODD_KEY = "sk/Qe+val=Hostile&9c1e5b"


@pytest.mark.parametrize(
    "echo",
    [
        lambda auth: _json({"error": {"message": f"denied {auth}"}}),  # the JSON error message
        lambda auth: f"<html>denied: {auth}</html>".encode(),  # a plain body
        lambda auth: _json({"detail": auth}).replace(b"/", b"\\/"),  # JSON with its slashes escaped
        lambda auth: f"denied: {json.dumps(auth)[:-1].replace('/', chr(92) + '/')}".encode(),  # JSON-escaped, not JSON
        lambda auth: f"denied {urllib.parse.quote(auth, safe='')}".encode(),  # URL-encoded
        lambda auth: f"denied {html.escape(auth)}".encode(),  # HTML-escaped
        lambda auth: b"y" * 280 + auth.encode(),  # cut at 300 characters mid-key
    ],
)
def test_every_form_of_an_echoed_key_is_scrubbed(server: str, echo: Callable[[str], bytes]) -> None:
    _route(lambda m, p, h, b: (400, echo(h.get("Authorization", "")), {}))
    client = Client(server, api_key=ODD_KEY, retries=0)
    with pytest.raises(ServerError) as err:
        client.post("/completions", {"a": 1})
    text = str(err.value)
    assert "HTTP 400" in text and "Qe" not in text and "Hostile" not in text and "9c1e5b" not in text, text


def test_a_key_in_a_200_answer_or_a_redirect_is_scrubbed(server: str) -> None:
    """The key echoed as generated text, a map key, an `error` in a 200 answer, a text that is
    not JSON, a redirect's target: replaced everywhere before anything reads it."""
    client = Client(server, api_key=KEY, retries=0)
    _route(lambda m, p, h, b: (200, _json({"choices": [{"text": h["Authorization"]}], "k": {KEY: 1}}), {}))
    answer = client.post("/completions", {})
    assert answer == {"choices": [{"text": f"Bearer {REDACTED}"}], "k": {REDACTED: 1}}
    for status, data, headers in [
        (200, _json({"error": f"no: {KEY}"}), {}),
        (200, f"oops {KEY}".encode(), {}),
        (307, b"", {"Location": f"http://127.0.0.1:1/?k={KEY}"}),
    ]:
        _route(lambda m, p, h, b, s=status, d=data, hd=headers: (s, d, hd))  # type: ignore[misc]
        with pytest.raises(ServerError) as err:
            client.post("/completions", {})
        assert KEY not in str(err.value) and REDACTED in str(err.value), err.value
    _route(lambda m, p, h, b: (200, f"metrics {KEY}".encode(), {}))
    assert client.get_text("/metrics") == f"metrics {REDACTED}"


def test_a_status_line_the_server_garbles_is_scrubbed() -> None:
    """http.client quotes a bad status line in its error: the key in it is scrubbed too."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(f"BOGUS {KEY}\r\n\r\n".encode())

        threading.Thread(target=answer, daemon=True).start()
        client = Client(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", api_key=KEY, retries=0)
        with pytest.raises(Unreachable) as err:
            client.post("/completions", {})
    assert KEY not in str(err.value) and REDACTED in str(err.value), err.value


# -- point 10: answers that cannot be true -------------------------------------------------------------


def _positions(answer: dict[str, Any], prompt: list[int]) -> Any:
    return scoring.window_arrays(scoring.positions(answer, "prompt_logprobs", prompt), 1, len(prompt) - 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda row: row["5"].update(logprob=5.0), "log-prob of 5.0"),
        (lambda row: row["5"].update(logprob=math.nan), "log-prob of nan"),
        (lambda row: row["5"].update(logprob=-math.inf), "log-prob of -inf"),
        (lambda row: row["5"].update(logprob="-1"), "not a number"),
        (lambda row: row["5"].update(logprob=10**400), "log-prob of inf"),
        (lambda row: [v.update(logprob=-0.01) for v in row.values()], "add up to more than 1"),
        (lambda row: row.update({"sk-x": {"logprob": -9.0, "rank": 3}}), "not an id"),
        (lambda row: row["5"].update(rank=-1), "rank"),
    ],
)
def test_impossible_log_probs_are_refused(change: Callable[[dict[str, Any]], Any], message: str) -> None:
    prompt = [1, 5, 6]
    answer = _logprob_answer(prompt)
    _positions(answer, prompt)  # the answer as sent is accepted
    change(answer["choices"][0]["prompt_logprobs"][1])
    with pytest.raises(BadAnswer, match=message):
        _positions(answer, prompt)


def test_impossible_echoed_log_probs_are_refused() -> None:
    prompt = [1, 5]
    top = {f"token_id:{t}": -3.0 - t / 100 for t in range(5, 5 + TOPK)}
    answer: dict[str, Any] = {"choices": [{"logprobs": {"token_logprobs": [None, -3.05], "top_logprobs": [None, top]}}]}
    scoring.positions(answer, "echo", prompt)
    answer["choices"][0]["logprobs"]["token_logprobs"][1] = math.nan
    with pytest.raises(BadAnswer, match="log-prob of nan"):
        scoring.positions(answer, "echo", prompt)


def test_nan_log_probs_through_the_client_are_refused_not_picked(server: str) -> None:
    """Python's json reads NaN: it used to reach the scores, and `tok >= top[0]` chose the first choice."""
    _route(lambda m, p, h, b: (200, _json(_logprob_answer(b["prompt"], math.nan)), {}))
    client = Client(server, retries=0)
    with pytest.raises(BadAnswer, match="nan"):
        scoring.score_prompt(
            lambda body: client.post("/completions", body, scoring.answer_bytes(body)),
            "m",
            [1, 5, 6],
            "prompt_logprobs",
            1,
            2,
        )


@pytest.mark.parametrize(
    ("usage", "text", "message"),
    [
        ({"completion_tokens": -7}, "4", "generated -7 tokens"),
        ({"completion_tokens": 7}, "4", "generated 7 tokens where at most 6"),
        ({"completion_tokens": 2.5}, "4", "generated 2.5 tokens"),
        ({"completion_tokens": 2}, "x" * 5000, "5,000 characters for at most 6 tokens"),
        ({"completion_tokens": 2}, ["4"], "not a string"),
    ],
)
def test_impossible_generations_are_refused(usage: dict[str, Any], text: Any, message: str) -> None:
    tok_chars = token_chars(_tokenizer())
    assert scoring.generation({"choices": [{"text": "4"}], "usage": {"completion_tokens": 2}}, 6, 6 * tok_chars) == "4"
    with pytest.raises(BadAnswer, match=message):
        scoring.generation({"choices": [{"text": text}], "usage": usage}, 6, 6 * tok_chars)


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL)


def test_an_oversized_answer_is_refused_unread(server: str) -> None:
    """5 MB of text for max_tokens 6, declared in Content-Length: refused before it is read."""
    body = scoring.generate_body("m", [1, 2], _gen_request(6))
    _route(lambda m, p, h, b: (200, _json({"choices": [{"text": "x" * 5_000_000}]}), {}))
    with pytest.raises(TooLarge, match="refused unread"):
        Client(server, retries=0).post("/completions", body, scoring.answer_bytes(body))


def _gen_request(n: int) -> Any:
    from qeval.backends.base import GenerateRequest

    return GenerateRequest(context="1 + 1 =", until=("\n",), max_gen_toks=n)


def test_a_60_mb_body_is_never_held(server: str) -> None:
    """60 MB with no Content-Length (read until the server closes): the client stops past the
    request's bound, holding no more than the bound and one piece (it read the 60 MB whole)."""
    piece = b"[" + b"0," * 2**19  # one piece sent 60 times: the server's own memory stays out of the count
    Handler.stream = staticmethod(lambda: (piece for _ in range(60)))
    _route(lambda m, p, h, b: (200, None, {}))
    body = scoring.logprob_body("m", [1, 2, 3], "prompt_logprobs")
    limit = scoring.answer_bytes(body)
    assert limit < 8 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="the rest was not read"):
            Client(server, retries=0).post("/completions", body, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * limit, peak


def test_a_stream_too_large_or_impossible_is_refused(server: str) -> None:
    from qeval.backends.openai.perf import stream_one

    client = Client(server, retries=0)
    body = {"model": "m", "prompt": [1], "max_tokens": 4}
    events = [
        b'data: {"choices": [{"text": "a"}]}\n\n',
        b'data: {"choices": [], "usage": {"completion_tokens": -7}}\n\n',
    ]
    Handler.stream = staticmethod(lambda: iter(events))
    _route(lambda m, p, h, b: (200, None, {}))
    with pytest.raises(BadAnswer, match="generated -7 tokens"):
        stream_one(lambda b: client.stream("/completions", b), body)
    Handler.stream = staticmethod(lambda: (b"data: " + b"x" * 2**20 for _ in range(3)))
    with pytest.raises(TooLarge):
        list(client.stream("/completions", body))


def test_a_version_string_is_cut_to_a_version(server: str) -> None:
    client = Client(server, retries=0)
    for version in ["v" * 100_000, "1." * 20_000]:
        _route(lambda m, p, h, b, v=version: (200, _json({"version": v}), {}))  # type: ignore[misc]
        stored = _server_version(client)
        assert stored is None or len(stored) <= MAX_VERSION_CHARS, len(stored or "")
    _route(lambda m, p, h, b: (200, _json({"version": "0.32.0\x1b[2J"}), {}))
    assert _server_version(client) == "0.32.0[2J"


def test_server_metrics_that_cannot_be_true_are_left_out() -> None:
    text = (
        'vllm:cache_config_info{block_size="-16",num_gpu_blocks="100"} 1.0\nvllm:kv_cache_usage_perc{engine="0"} NaN\n'
    )
    assert metrics.server_figures(text, 256) == {}
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\nvllm:kv_cache_usage_perc{engine="0"} 7\n'
    figures = metrics.server_figures(text, 256)
    assert figures["kv_cache_tokens"].measured == 1600 and "kv_cache_usage" not in figures


def test_an_impossible_answer_fails_its_setup_and_the_run_reports(server: str, tmp_path: Path) -> None:
    """NaN log-probs past the pre-run probe: the setup fails naming them, results.json is
    written and reads back (`qeval report`), no score of them is stored."""

    def route(method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, bytes | None, dict[str, str]]:
        if path.endswith("/health"):
            return 200, b"", {}
        if body is None:
            return 404, b"", {}
        nan = body["prompt"] != [1, 2, 3]  # the probe's prompt is answered well
        return 200, _json(_logprob_answer(body["prompt"], math.nan if nan else -1.0)), {}

    _route(route)
    srv = {"mode": "attach", "base_url": server, "model": "m", "retries": 0}
    cfg = make_config(
        tmp_path,
        setups=[{"name": "bf16", "baseline": True}],
        backend="openai",
        server=srv,
        tasks=["compare_mc"],
        gates=[],
    )
    out = tmp_path / "run"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "2", timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    setup = json.loads((out / "results.json").read_text())["setups"][0]
    assert setup["status"] == "failed" and "BadAnswer" in setup["error"] and "nan" in setup["error"], setup
    assert not (out / "samples" / "bf16" / "compare_mc.jsonl").exists()
    assert run_cli("report", str(out), timeout=300).returncode == 0


# -- point 15: a key in clear to another machine ---------------------------------------------------------


def test_a_key_over_plain_http_to_another_host_is_refused_before_any_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """192.0.2.1 (TEST-NET-1) is only a string here: the refusal comes at config load, and a
    connection attempt would fail this test."""
    from typer.testing import CliRunner

    from qeval.cli import app
    from qeval.config import load_config

    def no_connection(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket, "create_connection", no_connection)
    monkeypatch.setattr(socket.socket, "connect", no_connection)
    monkeypatch.setenv(KEY_ENV, KEY)
    srv = {"mode": "attach", "base_url": "http://192.0.2.1:8000/v1", "model": "m", "api_key_env": KEY_ENV}
    cfg = make_config(
        tmp_path,
        setups=[{"name": "bf16", "baseline": True}],
        backend="openai",
        server=srv,
        tasks=["compare_mc"],
        gates=[],
    )
    res = CliRunner().invoke(app, ["validate", str(cfg)])
    assert res.exit_code == 2 and not isinstance(res.exception, AssertionError), res.output
    with pytest.raises(UserError) as err:
        load_config(cfg)
    line = str(err.value)
    assert "\n" not in line and "plain http to 192.0.2.1" in line and "allow_insecure_key" in line, line
    assert KEY not in line and KEY not in res.output
    load_config(
        make_config(
            tmp_path,
            filename="ok.yaml",
            setups=[{"name": "bf16", "baseline": True}],
            backend="openai",
            server=srv | {"allow_insecure_key": True},
            tasks=["compare_mc"],
            gates=[],
        )
    )


@pytest.mark.parametrize(
    ("url", "key", "allowed", "refused"),
    [
        ("http://10.1.2.3:8000/v1", KEY_ENV, False, True),
        ("http://models.example.com/v1", KEY_ENV, False, True),
        ("http://[2001:db8::1]:8000/v1", KEY_ENV, False, True),
        ("http://127.0.0.1:8000/v1", KEY_ENV, False, False),
        ("http://127.9.9.9:8000/v1", KEY_ENV, False, False),
        ("http://localhost:8000/v1", KEY_ENV, False, False),
        ("http://[::1]:8000/v1", KEY_ENV, False, False),
        ("https://models.example.com/v1", KEY_ENV, False, False),
        ("http://10.1.2.3:8000/v1", None, False, False),
        ("http://10.1.2.3:8000/v1", KEY_ENV, True, False),
    ],
)
def test_which_routes_of_the_key_are_refused(url: str, key: str | None, allowed: bool, refused: bool) -> None:
    spec = {"mode": "attach", "base_url": url, "model": "m", "api_key_env": key, "allow_insecure_key": allowed}
    if refused:
        with pytest.raises(ValidationError, match="sent in clear over plain http"):
            ServerSpec.model_validate(spec)
    else:
        ServerSpec.model_validate(spec)


# -- minor: the summary of a setup whose server reports no KV figure ---------------------------------------


def test_the_summary_says_what_it_does_not_know() -> None:
    """An attached server reports no KV bytes per token: the terminal summary said `None`."""
    import io

    from rich.console import Console

    from qeval.report.markdown import print_summary
    from qeval.results.schema import Figure, read_results

    results = read_results(Path(__file__).resolve().parents[1] / "data" / "run-v1" / "results.json")
    setups = []
    for i, s in enumerate(results.setups):
        kv = Figure(predicted=None) if i == 0 else Figure(predicted=4096)
        setups.append(s.model_copy(update={"memory": s.memory.model_copy(update={"kv_bytes_per_token": kv})}))
    out = io.StringIO()
    print_summary(results.model_copy(update={"setups": setups}), Console(file=out, width=250))
    text = out.getvalue()
    assert "None" not in text and "n/a" in text and "4096 (p)" in text, text


def test_a_key_in_a_dead_launched_servers_log_is_scrubbed(tmp_path: Path) -> None:
    """A launched server that logs the key it was handed (its environment, a refused request's
    header) and dies: the error quoting its log's last lines, which lands in results.json and
    the reports, holds no form of the key (issue 40 review, point 2)."""
    import sys

    from qeval.backends.openai.launch import LaunchedServer, ServerDied

    script = (
        "import os, urllib.parse; k = os.environ['VLLM_API_KEY']; "
        "print('ValueError: refused Authorization: Bearer ' + k + ' / ' + urllib.parse.quote(k, safe=''))"
    )
    server = LaunchedServer(
        [sys.executable, "-c", script + "; raise SystemExit(3)"], {"VLLM_API_KEY": KEY}, tmp_path / "server.log"
    )
    server.proc.wait(60)
    with pytest.raises(ServerDied) as caught:
        server.check_alive()
    message = str(caught.value)
    assert "exit status 3" in message and REDACTED in message
    assert KEY not in message and urllib.parse.quote(KEY, safe="") not in message
    server.stop()


@pytest.mark.parametrize("short", ["x", "1", "EMPTY", "abc1234"])
def test_a_key_short_enough_to_occur_in_answers_is_refused(monkeypatch: pytest.MonkeyPatch, short: str) -> None:
    """The key is scrubbed from every string of an answer: a key "x" renamed each answer's "text"
    field ("te[redacted]t": every generation scored as empty) and a key "1" rewrote token ids
    ("[redacted]7"), silently. Such a key is refused in one line, its value not shown (issue 40
    review, point 2)."""
    from types import SimpleNamespace

    from qeval.backends.openai.support import api_key

    cfg: Any = SimpleNamespace(
        server=ServerSpec(mode="attach", base_url="http://127.0.0.1:1/v1", model="m", api_key_env=KEY_ENV)
    )
    monkeypatch.setenv(KEY_ENV, short)
    with pytest.raises(UserError, match="shorter than 8 characters") as caught:
        api_key(cfg)
    assert len(short) < 5 or short not in str(caught.value).replace(KEY_ENV, "")  # "x" is in any sentence
    monkeypatch.setenv(KEY_ENV, KEY)
    assert api_key(cfg) == KEY


def test_an_answer_trickled_a_byte_at_a_time_is_bounded_in_time(server: str) -> None:
    """`timeout_s` bounds each socket read: a server sending its answer a byte every 0.3 s never
    trips it, and held a request for as long as it liked (a 1 MiB bound is 3 days at that rate).
    The whole answer must arrive within `timeout_s` (issue 40 review, point 10)."""
    import time

    def trickle() -> Iterator[bytes]:
        for ch in b'{"choices": [{"text": "' + b"x" * 60 + b'"}]}':
            time.sleep(0.3)
            yield bytes([ch])

    Handler.stream = staticmethod(trickle)
    _route(lambda m, p, h, b: (200, None, {}))
    t0 = time.monotonic()
    with pytest.raises(Unreachable, match="more than 1 s to arrive"):
        Client(server, timeout_s=1.0, retries=0).post("/completions", {"model": "m", "prompt": [1]})
    assert time.monotonic() - t0 < 5


def test_an_error_body_trickled_a_byte_at_a_time_is_cut_in_time(server: str) -> None:
    """A 400 whose body comes a byte every 0.3 s held the request until all of it had come (the
    error body was read with read(64 KiB)); it is read for at most timeout_s, and the request
    fails with the part that came (issue 40 review, point 10)."""
    import time

    def trickle() -> Iterator[bytes]:
        for ch in b"bad request " + b"x" * 60:
            time.sleep(0.3)
            yield bytes([ch])

    Handler.stream = staticmethod(trickle)
    _route(lambda m, p, h, b: (400, None, {"Content-Type": "text/plain"}))
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="HTTP 400: bad"):
        Client(server, timeout_s=1.0, retries=0).post("/completions", {"model": "m", "prompt": [1]})
    assert time.monotonic() - t0 < 5
