"""The openai backend's pieces without an engine: the `server:` block and its base_url check, the
launch command from the in-process backend's translation table, the HTTP client's retries, the
launched process's death and cleanup, and the parsers of what vLLM's server returned (the
answers below were captured from `vllm serve` 0.32 on the shipped model)."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from qeval.backends import check_blocks
from qeval.backends.openai import metrics, scoring
from qeval.backends.openai.client import Client, ServerError, Unreachable
from qeval.backends.openai.launch import LaunchedServer, ServerDied, free_port
from qeval.backends.openai.support import flags, key_parts, serve_argv, validate_served
from qeval.backends.vllm.support import setup_engine_args
from qeval.config import RunConfig
from qeval.config.server import ServerSpec, base_url_problem
from qeval.errors import UserError
from tests.helpers import MODEL, make_config, one_line_exit_2, run_cli


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:8000/v1", None),
        ("https://models.example.com/v1", None),
        ("ftp://127.0.0.1/v1", "must start with http:// or https://"),
        ("127.0.0.1:8000", "must start with http:// or https://"),
        ("http:///v1", "names no host"),
        ("http://user:secret@127.0.0.1/v1", "must not carry credentials"),
        ("http://127.0.0.1/v1?x=1", "query or fragment"),
        ("http://127.0.0.1:99999/v1", "is not a URL"),
    ],
)
def test_base_url_is_checked(url: str, problem: str | None) -> None:
    found = base_url_problem(url)
    assert (found is None) if problem is None else (found is not None and problem in found), found


def test_server_block_modes() -> None:
    url = ServerSpec(mode="attach", base_url="http://127.0.0.1:8000/v1/", model="m").base_url
    assert url is not None and url.endswith("/v1")
    with pytest.raises(ValidationError, match="attach needs base_url and model"):
        ServerSpec(mode="attach", base_url="http://127.0.0.1:8000/v1")
    with pytest.raises(ValidationError, match="applies to mode attach only"):
        ServerSpec(mode="launch", base_url="http://127.0.0.1:8000/v1")
    with pytest.raises(ValidationError, match="unknown placeholder"):
        ServerSpec(command=["sglang", "--model-path", "{modle}"])


def test_a_bad_base_url_is_one_line(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path,
        backend="openai",
        setups=[{"name": "bf16", "baseline": True}],
        server={"mode": "attach", "base_url": "http://u:pw@127.0.0.1:1/v1", "model": "m"},
    )
    one_line_exit_2(run_cli("validate", str(cfg), timeout=120), "must not carry credentials")


def _cfg(**server: Any) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "t",
            "model": {"path": str(MODEL), "max_context": 256, "dtype": "float32"},
            "backend": "openai",
            "tasks": ["addition"],
            "server": server or {},
            "setups": [
                {"name": "bf16", "baseline": True},
                {"name": "w8a8", "weights": "int8", "method": "w8a8", "checkpoint": "/ckpt/w8a8"},
                {"name": "kv", "kv_cache": "fp8"},
            ],
        }
    )


def test_kv_accounting_is_the_served_engines() -> None:
    """A launched vLLM server is sized by vLLM's rules, with `vllm serve`'s batched tokens on a CPU
    (the LLM class's 4,096 is the in-process backend's); an attached server or a command template
    runs an engine qeval cannot see: no rules, so no sequence predicted (not transformers')."""
    from qeval.backends import backend_entry
    from qeval.backends.vllm.kv_rule import PagedKv
    from qeval.backends.vllm.support import cache_accounting

    kv = backend_entry("openai").kv_accounting
    launched = kv(_cfg(), "cpu")
    assert isinstance(launched, PagedKv) and launched.engine == "vllm"
    assert launched.cache.in_flight_tokens == 2048 != cache_accounting("cpu").in_flight_tokens
    assert launched.cache.block_size == cache_accounting("cpu").block_size
    assert kv(_cfg(), "cuda") == backend_entry("vllm").kv_accounting(_cfg(), "cuda")
    assert kv(_cfg(mode="attach", base_url="http://127.0.0.1:1/v1", model="m"), "cpu") is None
    assert kv(_cfg(command=["serve", "{model}", "--port", "{port}"]), "cpu") is None


def test_launch_command_is_the_in_process_engine_table() -> None:
    """Every engine argument the in-process backend passes to vllm.LLM is on the command line."""
    cfg = _cfg()
    for setup in cfg.setups:
        argv, args = serve_argv(cfg, setup, "cpu", 4321, "127.0.0.1")
        assert args == setup_engine_args(cfg, setup, "cpu")
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--port") + 1] == "4321" and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[len(argv) - len(flags(args)) :] == flags(args)
    argv, _ = serve_argv(cfg, cfg.setups[1], "cpu", 1, "127.0.0.1")
    assert argv[argv.index("--model") + 1] == "/ckpt/w8a8"
    argv, _ = serve_argv(cfg, cfg.setups[2], "cpu", 1, "127.0.0.1")
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert flags({"enforce_eager": True, "trust_remote_code": False, "max_num_seqs": None, "seed": 3}) == [
        "--enforce-eager",
        "--no-trust-remote-code",
        "--seed",
        "3",
    ]


def test_command_template_and_its_refusals() -> None:
    cfg = _cfg(
        command=[
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "{model}",
            "--port",
            "{port}",
            "--host",
            "{host}",
            "--served-model-name",
            "{served_model_name}",
        ]
    )
    argv, _ = serve_argv(cfg, cfg.setups[1], "cpu", 999, "127.0.0.1")
    assert argv == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/ckpt/w8a8",
        "--port",
        "999",
        "--host",
        "127.0.0.1",
        "--served-model-name",
        "qeval",
    ]
    validate_served(cfg, cfg.setups[1], "cpu")
    with pytest.raises(UserError, match="put its KV-cache or quantization flags in server.command"):
        validate_served(cfg, cfg.setups[2], "cpu")


def test_resume_key_names_the_server_not_its_port() -> None:
    parts = key_parts(_cfg(mode="attach", base_url="http://127.0.0.1:8000/v1", model="m"))
    assert parts == {
        "mode": "attach",
        "served_model": "m",
        "logprobs": "prompt_logprobs",
        "base_url": "http://127.0.0.1:8000/v1",
    }
    assert "engine" in key_parts(_cfg())


# -- the HTTP client against a real local HTTP server ------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    script: list[tuple[int, dict[str, Any]]] = []
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"auth": self.headers.get("Authorization"), "body": body})
        status, answer = type(self).script.pop(0) if type(self).script else (200, {"ok": True})
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def local_http() -> Iterator[str]:
    _Handler.script, _Handler.seen = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_client_retries_busy_answers_and_not_refusals(local_http: str) -> None:
    _Handler.script = [(503, {}), (429, {}), (200, {"n": 1})]
    client = Client(local_http, api_key="k-123", retries=3, backoff_s=0.01)
    assert client.post("/completions", {"a": 1}) == {"n": 1}
    assert len(_Handler.seen) == 3 and all(s["auth"] == "Bearer k-123" for s in _Handler.seen)
    _Handler.script = [(400, {"error": {"message": "prompt_logprobs is not supported"}})]
    with pytest.raises(ServerError, match="HTTP 400: prompt_logprobs is not supported") as err:
        client.post("/completions", {})
    assert "k-123" not in str(err.value) and len(_Handler.seen) == 4  # a refusal is not retried
    assert client.map(lambda i: i * 2, [1, 2, 3], 2) == [2, 4, 6]


def test_client_gives_up_on_a_dead_port() -> None:
    client = Client(f"http://127.0.0.1:{free_port()}/v1", retries=2, backoff_s=0.01)
    with pytest.raises(Unreachable):
        client.post("/completions", {})
    assert not client.healthy(timeout=1)


# -- the launched process ---------------------------------------------------------------------------


def test_a_dead_server_is_named_with_its_log(tmp_path: Path) -> None:
    server = LaunchedServer(
        [sys.executable, "-c", "print('engine failed: no kernel'); raise SystemExit(3)"], {}, tmp_path / "log"
    )
    with pytest.raises(ServerDied, match=r"exit status 3; its log: engine failed: no kernel"):
        server.wait_healthy(lambda: False, 30)
    server.stop()


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    import psutil

    server = LaunchedServer(["sh", "-c", "sleep 300 & sleep 300"], {}, tmp_path / "log")
    deadline = time.time() + 10
    while not psutil.Process(server.pid).children() and time.time() < deadline:
        time.sleep(0.05)
    child = psutil.Process(server.pid).children()[0]
    server.stop(grace_s=2)
    deadline = time.time() + 5  # SIGKILL is delivered at once; the state shows a moment later
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.05)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


# -- what vLLM's server answers (captured from vllm serve 0.32, prompt [1, 5, 6, 7], k=2) ------------

PROMPT_LOGPROBS = {
    "choices": [
        {
            "text": "+",
            "prompt_logprobs": [
                None,
                {
                    "5": {"logprob": -16.937175750732422, "rank": 74},
                    "45": {"logprob": -0.7951745390892029, "rank": 1},
                    "48": {"logprob": -2.061878204345703, "rank": 2},
                },
                {
                    "6": {"logprob": -16.89262580871582, "rank": 113},
                    "4": {"logprob": -0.08832163363695145, "rank": 1},
                    "86": {"logprob": -2.732769012451172, "rank": 2},
                },
                {
                    "7": {"logprob": -16.29963493347168, "rank": 98},
                    "81": {"logprob": -0.6407859921455383, "rank": 1},
                    "4": {"logprob": -1.8520362377166748, "rank": 2},
                },
            ],
        }
    ],
    "usage": {"completion_tokens": 1},
}
ECHO = {
    "choices": [
        {
            "text": '<s>!"#',
            "logprobs": {
                "token_logprobs": [None, -16.937175750732422, -16.89262580871582, -16.29963493347168],
                "tokens": ["token_id:1", "token_id:5", "token_id:6", "token_id:7"],
                "top_logprobs": [
                    None,
                    {
                        "token_id:5": -16.937175750732422,
                        "token_id:45": -0.7951745390892029,
                        "token_id:48": -2.061878204345703,
                    },
                    {
                        "token_id:6": -16.89262580871582,
                        "token_id:4": -0.08832163363695145,
                        "token_id:86": -2.732769012451172,
                    },
                    {
                        "token_id:7": -16.29963493347168,
                        "token_id:81": -0.6407859921455383,
                        "token_id:4": -1.8520362377166748,
                    },
                ],
            },
        }
    ]
}


def test_both_logprob_forms_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scoring, "TOPK", 2)  # the captured answers asked for k=2
    prompt = [1, 5, 6, 7]
    a, b = scoring.positions(PROMPT_LOGPROBS, "prompt_logprobs", prompt), scoring.positions(ECHO, "echo", prompt)
    assert a == b and a[0] is None
    assert a[1] == (-16.937175750732422, [(45, -0.7951745390892029), (48, -2.061878204345703)])
    tok, ids, lps = scoring.window_arrays(a, 1, 3)
    assert tok.tolist() == [-16.937175750732422, -16.89262580871582, -16.29963493347168]
    assert ids.tolist() == [[45, 48], [4, 86], [81, 4]] and (lps[:, 0] >= lps[:, 1]).all()


def test_too_few_top_logprobs_say_what_to_raise() -> None:
    rows = scoring.positions(PROMPT_LOGPROBS, "prompt_logprobs", [1, 5, 6, 7])
    with pytest.raises(RuntimeError, match="--max-logprobs"):
        scoring.window_arrays(rows, 1, 3)


METRICS = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",gpu_memory_utilization="0.2",\
kv_cache_size_tokens="2065792",num_cpu_blocks="None",num_gpu_blocks="16139"} 1.0
"""


def test_server_memory_from_its_metrics() -> None:
    figures = metrics.server_figures(METRICS, 256)
    assert figures["kv_cache_tokens"].measured == 16139 * 128
    assert "num_gpu_blocks x block_size" in figures["kv_cache_tokens"].source
    assert figures["max_concurrency"].measured == round(16139 * 128 / 256, 2)
    assert figures["kv_cache_usage"].measured == 0.25
    assert metrics.server_figures("# nothing here\n", 256) == {}
    assert metrics.server_figures(None, 256) == {}


def test_the_key_comes_from_the_named_variable_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from qeval.backends.openai.support import api_key

    cfg = _cfg(mode="attach", base_url="http://127.0.0.1:8000/v1", model="m", api_key_env="QEVAL_T_KEY")
    monkeypatch.delenv("QEVAL_T_KEY", raising=False)
    with pytest.raises(UserError, match="the environment variable QEVAL_T_KEY is not set"):
        api_key(cfg)
    monkeypatch.setenv("QEVAL_T_KEY", "s3cret-key-7")
    assert api_key(cfg) == "s3cret-key-7"
    assert "s3cret-key-7" not in json.dumps(cfg.as_json()) and cfg.as_json()["server"]["api_key_env"] == "QEVAL_T_KEY"


def test_a_launched_server_dies_with_its_worker(tmp_path: Path) -> None:
    """kill -9 of the process that launched the server (the worker): the server goes with it
    (PR_SET_PDEATHSIG), not on under PID 1."""
    import os
    import signal
    import subprocess

    import psutil

    code = (
        "import sys, time; from pathlib import Path; from qeval.backends.openai.launch import LaunchedServer; "
        f"s = LaunchedServer(['sleep', '300'], {{}}, Path({str(tmp_path / 'log')!r})); print(s.pid, flush=True); "
        "time.sleep(300)"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    assert worker.stdout is not None
    server = psutil.Process(int(worker.stdout.readline()))
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    deadline = time.time() + 5
    while server.is_running() and server.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.05)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE


# -- hostile inputs and surroundings (an adversarial review's findings) -------------------------------


class _Redirect(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_POST(self) -> None:  # http.server's name
        self.send_response(307)
        self.send_header("Location", type(self).target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_no_proxy_and_no_redirect_carries_the_key_away(local_http: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib honours http_proxy even for 127.0.0.1 and resends Authorization on a redirect to
    any host: the client does neither."""
    # a proxy where nothing listens: a request sent through it would fail to connect
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("no_proxy", "")
    assert Client(local_http, api_key="k-1", retries=0).post("/completions", {"a": 1}) == {"ok": True}
    assert len(_Handler.seen) == 1
    redirect = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    threading.Thread(target=redirect.serve_forever, daemon=True).start()
    try:
        _Redirect.target = local_http + "/steal"
        client = Client(f"http://127.0.0.1:{redirect.server_address[1]}/v1", api_key="k-1", retries=0)
        with pytest.raises(ServerError, match="redirected to"):
            client.post("/completions", {"a": 1})
        assert len(_Handler.seen) == 1  # nothing followed the redirect
    finally:
        redirect.shutdown()


def test_an_error_in_a_200_answer_is_a_server_error(local_http: str) -> None:
    _Handler.script = [(200, {"error": {"message": "model not loaded"}}), (200, {"object": "x"})]
    client = Client(local_http, retries=0)
    with pytest.raises(ServerError, match="model not loaded"):
        client.post("/completions", {})
    with pytest.raises(RuntimeError, match="no choices"):
        scoring.generation(client.post("/completions", {}))


def test_a_key_a_header_cannot_carry_is_refused_without_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from qeval.backends.openai.support import api_key

    cfg = _cfg(mode="attach", base_url="http://127.0.0.1:8000/v1", model="m", api_key_env="QEVAL_T_KEY")
    monkeypatch.setenv("QEVAL_T_KEY", "sk-SECRET\r\n")  # a CRLF .env file: stripped
    assert api_key(cfg) == "sk-SECRET"
    monkeypatch.setenv("QEVAL_T_KEY", "sk-SEC\nRET")
    with pytest.raises(UserError) as err:
        api_key(cfg)
    assert "SEC" not in str(err.value) and "QEVAL_T_KEY" in str(err.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1/v1?", "http://127.0.0.1/v1#", " http://127.0.0.1/v1", "http://127.0.0.1/v1\n"]
)
def test_urls_urlsplit_would_quietly_change_are_refused(url: str) -> None:
    assert base_url_problem(url) is not None


def test_config_mistakes_are_refused_where_they_are_written() -> None:
    with pytest.raises(ValidationError, match="a literal brace"):
        ServerSpec(command=["sglang", "--json-args", "{"])
    assert ServerSpec(command=["s", "--json", '{{"a": 1}}']).command is not None
    cfg = RunConfig.model_validate(
        {
            "name": "t",
            "model": {"path": str(MODEL)},
            "backend": "hf",
            "tasks": ["addition"],
            "setups": [{"name": "b", "baseline": True}],
            "server": {},
        }
    )
    # the backend's registry entry says which backend takes a server: block (checked at preflight)
    with pytest.raises(UserError, match="server: applies to backend openai only"):
        check_blocks(cfg)
    for line in (
        "performance.from_workload: backend openai does not time waves of the workload's lengths",
        "performance.from_workload: backend vllm does not time waves",
    ):
        backend = line.split("backend ")[1].split()[0]
        other = cfg.model_copy(
            update={
                "backend": backend,
                "server": None,
                "performance": cfg.performance.model_copy(update={"enabled": True, "from_workload": True}),
            }
        )
        with pytest.raises(UserError, match=line.replace("(", r"\(").replace(")", r"\)")):
            check_blocks(other)


def test_requests_pin_every_sampling_field_and_the_server_ignores_the_model_card() -> None:
    """vLLM's server fills unset sampling fields from generation_config.json (a repetition
    penalty changes greedy text); the in-process engine never reads it."""
    from qeval.backends.base import GenerateRequest

    body = scoring.generate_body("m", [1, 2], GenerateRequest(context="x", until=("\n",), max_gen_toks=4))
    assert body["temperature"] == 0.0 and body["repetition_penalty"] == 1.0 and body["top_k"] == -1
    assert {"min_p", "presence_penalty", "frequency_penalty", "top_p"} <= set(body)
    argv, _ = serve_argv(_cfg(), _cfg().setups[0], "cpu", 1, "127.0.0.1")
    assert argv[argv.index("--generation-config") + 1] == "vllm"


def test_a_shell_vllm_api_key_is_not_inherited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "from-the-shell")
    out = tmp_path / "env.txt"
    server = LaunchedServer(
        [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ.get('VLLM_API_KEY', 'unset'))"],
        {},
        tmp_path / "log",
    )
    server.proc.wait(30)
    assert out.read_text() == "unset"


def test_the_port_must_be_held_by_the_launched_server(tmp_path: Path, local_http: str) -> None:
    """A /health 200 on the port counts only from the launched process tree: another process
    that took the port between free_port() and the bind is not the server."""
    port = free_port()
    server = LaunchedServer(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], {}, tmp_path / "log"
    )
    try:
        deadline = time.monotonic() + 30
        while not server.listens_on(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.listens_on(port)
        assert not server.listens_on(int(local_http.split(":")[2].split("/")[0]))  # this test's own server
    finally:
        server.stop()
