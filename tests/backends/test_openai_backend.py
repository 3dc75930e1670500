"""The openai backend for real: `vllm serve` (the CPU build, started through its module) launched
per setup, and attached to, on the shipped model in float32. Its scores equal the in-process
vllm backend's per document; a server killed mid-run fails that setup with its cause, and the
rerun completes; the API key is nowhere in the run directory.

Engine starts are the cost here (~40-60 s each on this machine): the in-process references are
the session's vLLM runs of the same configs (tests/conftest.py: `vllm_bf16_runs`' float32 run for
bf16, `vllm_demo`'s W8A8 where the demo computes in bfloat16; test_vllm_backend checks both runs),
so this file starts one launched run of W8A8 (its server killed once, relaunched by the rerun) and
one float32 server the attach test starts itself (the 16-bit setup's generations against the
engine's), all shared through module fixtures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import (
    AGREEMENT_TASKS,
    ROOT,
    assert_figures_carry_their_source,
    one_line_exit_2,
    run_cli,
    validate_results,
)

pytestmark = pytest.mark.slow
LIMIT = "20"
#: addition first: the kill lands while compare_mc (the slowest of the three) is being scored
TASKS = "addition,compare_mc,ppl"
assert set(TASKS.split(",")) == set(AGREEMENT_TASKS.split(","))  # the in-process references scored each of them
KEY = "qeval-test-key-5d1c0b7e9a"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


#: per setup, the dtype it is compared in: float32 for the 16-bit setup (the API's scores must equal the
#: engine's to 1e-4 nats); bfloat16 for W8A8, because vLLM's CPU int8 kernel takes 16-bit activations only
#: (measured: `int8_scaled_mm_with_quant: expect A to be bfloat16 or half.` in float32)
DTYPES = {"bf16": "float32", "w8a8": "bfloat16"}


def _config(
    quantized: Path, tmp: Path, name: str, backend: str, server: dict[str, Any] | None, only: str | None = None
) -> Path:
    """The quantize fixture's demo config on `backend`; with `only`, that one setup (as the
    baseline) in its DTYPES dtype, else every setup in float32. W8A8 is pointed at the fixture's
    folder (`checkpoint:`: a folder's key holds the dtype it was planned for)."""
    cfg = yaml.safe_load(quantized.read_text())
    cfg["name"], cfg["backend"] = name, backend
    cfg["model"]["dtype"] = DTYPES[only] if only else "float32"
    folder = Path(cfg["quantize"]["output_dir"])
    (w8a8,) = [p for p in folder.glob("*-w8a8-*") if (p / "config.json").is_file()]
    for setup in cfg["setups"]:
        if setup["name"] == "w8a8":
            setup["checkpoint"] = str(w8a8.resolve())
    if only:
        cfg["setups"] = [s | {"baseline": True} for s in cfg["setups"] if s["name"] == only]
        cfg["gates"] = []
    cfg.pop("performance", None)
    if server is not None:
        cfg["server"] = server
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _samples(run: Path, setup: str, task: str) -> dict[str, dict[str, Any]]:
    return {r["sample_id"]: r for r in map(json.loads, (run / "samples" / setup / f"{task}.jsonl").open())}


def _results(run: Path) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in json.loads((run / "results.json").read_text())["setups"]}


def _run_args(cfg: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(cfg), "--output", str(out), "--tasks", TASKS, "--limit", LIMIT, "--no-performance", *extra]


@pytest.fixture(scope="module")
def in_process(
    quantized_demo: tuple[Path, Path, str],
    vllm_demo: tuple[Path, str],
    vllm_bf16_runs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Each setup on the in-process vllm backend, in its DTYPES dtype: the reference. The same
    config's runs the session makes anyway, on the first DEMO_LIMIT documents a task or more (the first
    LIMIT are the ones compared): bf16 in float32 from vllm_bf16_runs, W8A8 in bfloat16 from the
    demo where `dtype: auto` computes in it; elsewhere W8A8 is run here."""
    outs = {"bf16": vllm_bf16_runs[DTYPES["bf16"]]}
    demo, dtype = vllm_demo
    if dtype == DTYPES["w8a8"]:
        outs["w8a8"] = demo
    else:
        tmp = tmp_path_factory.mktemp("inproc")
        outs["w8a8"] = tmp / "w8a8"
        res = run_cli(*_run_args(_config(quantized_demo[0], tmp, "inproc-w8a8", "vllm", None, "w8a8"), outs["w8a8"]))
        assert res.returncode == 0, res.stderr[-3000:]
    return outs


def _server_pids(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if SERVER_MODULE in cmd and text in cmd:
            found.append(int(pid))
    return found


@pytest.fixture(scope="module")
def launched(quantized_demo: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """W8A8 launched in its DTYPES dtype; its server is SIGKILLed once its first task is stored (the
    setup fails with that cause), then the same command runs again (it resumes and completes). The
    16-bit setup is not launched a second time: the attach test's server serves it in float32."""
    tmp = tmp_path_factory.mktemp("launch")
    server = {"mode": "launch", "concurrency": 4}
    outs = {"w8a8": tmp / "w8a8"}
    cfg, out = _config(quantized_demo[0], tmp, "launch-w8a8", "openai", server, "w8a8"), outs["w8a8"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", *_run_args(cfg, out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = out / "samples" / "w8a8" / "addition.jsonl"
    killed: list[int] = []
    deadline = time.time() + 900
    while proc.poll() is None and time.time() < deadline and not killed:
        if first.is_file():
            killed = _server_pids(str(quantized_demo[1].resolve()))  # the W8A8 server: it serves the checkpoint
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=900)
    assert killed, err[-3000:]
    first_try = _results(out)
    validate_results(out / "results.json")
    stamp = first.stat().st_mtime_ns
    rerun = run_cli(*_run_args(cfg, out))
    return {
        "outs": outs,
        "first_code": proc.returncode,
        "first": first_try,
        "rerun": rerun,
        "stamp": stamp,
        "first_task": first,
        "stderr": err,
    }


def test_a_killed_server_fails_its_setup_and_the_rerun_completes(launched: dict[str, Any]) -> None:
    assert launched["first_code"] == 1, launched["stderr"][-2000:]  # a setup failed: exit 1
    w8 = launched["first"]["w8a8"]
    assert w8["status"] == "failed" and "ServerDied" in w8["error"] and "killed by signal 9" in w8["error"], w8
    rerun = launched["rerun"]
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    done = _results(launched["outs"]["w8a8"])
    assert all(s["status"] == "ok" for s in done.values()), {n: s["error"] for n, s in done.items()}
    assert launched["first_task"].stat().st_mtime_ns == launched["stamp"]  # stored before the kill: kept


def test_launched_scores_equal_the_in_process_engine(launched: dict[str, Any], in_process: dict[str, Path]) -> None:
    """Per document, the same engine in process and behind the API: log-likelihoods within 1e-4
    nats and identical greedy generations, for W8A8 in bfloat16 (the CPU int8 kernel's only
    activations; measured: equal to the last bit, 20 documents a task, as the 16-bit setup in
    float32 was), its documents scored by two servers (the killed one and the rerun's). The launched
    server ran the in-process engine's arguments, on vLLM's int8 kernel."""
    tol = {"w8a8": 1e-4}
    for setup in launched["outs"]:
        api, ref = launched["outs"][setup], in_process[setup]
        a, r = _samples(api, setup, "compare_mc"), _samples(ref, setup, "compare_mc")
        assert set(a) <= set(r) and len(a) == int(LIMIT)  # the reference scored the same documents, and more
        diff = max(abs(x - y) for k in a for x, y in zip(a[k]["loglikelihoods"], r[k]["loglikelihoods"], strict=True))
        assert diff < tol[setup], (setup, diff)
        a, r = _samples(api, setup, "ppl"), _samples(ref, setup, "ppl")
        assert set(a) <= set(r) and len(a) == int(LIMIT) and all(a[k]["n_tokens"] == r[k]["n_tokens"] for k in a)
        assert max(abs(a[k]["nll"] - r[k]["nll"]) for k in a) < tol[setup], setup
        a, r = _samples(api, setup, "addition"), _samples(ref, setup, "addition")
        assert set(a) <= set(r) and len(a) == int(LIMIT) and all(a[k]["prediction"] == r[k]["prediction"] for k in a), (
            setup
        )
        q, rq = _results(api)[setup]["quantization"], _results(ref)[setup]["quantization"]
        assert q["engine_args"] == rq["engine_args"], setup  # one translation table
        assert q["server"]["argv"][1:3] == ["-m", SERVER_MODULE]
    w8 = _results(launched["outs"]["w8a8"])["w8a8"]
    assert "CompressedTensorsW8A8Int8" in w8["quantization"]["engine_kernels"]
    mem = w8["memory"]
    assert mem["engine"]["kv_cache_tokens"] > 0 and mem["engine"]["source"].startswith("server /metrics")
    assert "RSS of the launched server" in mem["peak_bytes"]["source"] and mem["peak_bytes"]["measured"] > 0
    assert mem["weights_bytes"]["source"].startswith("not measured")


@pytest.fixture(scope="module")
def attached(quantized_demo: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A vLLM server the test starts itself (float32, as the launched bf16 one), with an API key and
    at most one log-probability per position: enough to generate, not to score likelihoods."""
    from qeval.backends.openai.client import Client
    from qeval.backends.openai.launch import HOST, LaunchedServer, free_port
    from qeval.backends.openai.support import serve_argv
    from qeval.config import load_config

    tmp = tmp_path_factory.mktemp("attach")
    cfg = load_config(_config(quantized_demo[0], tmp, "attach", "openai", {"mode": "launch", "model": "tiny"}, "bf16"))
    port = free_port()
    argv, _ = serve_argv(cfg, cfg.baseline, "cpu", port, HOST)
    server = LaunchedServer(argv + ["--max-logprobs", "1"], {"VLLM_API_KEY": KEY}, tmp / "server.log")
    try:
        server.wait_healthy(Client(f"http://{HOST}:{port}/v1").healthy, 600)
        yield tmp, f"http://{HOST}:{port}/v1"
    finally:
        server.stop()


def test_attach_generates_as_the_engine_and_keeps_the_key_secret(
    attached: Any, quantized_demo: Any, in_process: dict[str, Path]
) -> None:
    tmp, url = attached
    server = {"mode": "attach", "base_url": url, "model": "tiny", "api_key_env": "QEVAL_TEST_API_KEY"}
    cfg = _config(quantized_demo[0], tmp, "attached", "openai", server, "bf16")
    text = yaml.safe_load(cfg.read_text())  # a small performance phase: streaming requests at two levels
    text["performance"] = {
        "input_len": 16,
        "output_len": 8,
        "num_requests": 4,
        "concurrency": [1, 2],
        "repeats": 1,
        "warmup": 0,
    }
    cfg.write_text(yaml.safe_dump(text, sort_keys=False))
    out = tmp / "out"
    os.environ["QEVAL_TEST_API_KEY"] = KEY
    try:
        res = run_cli(
            "run", str(cfg), "--output", str(out), "--setups", "bf16", "--tasks", "addition", "--limit", LIMIT
        )
        assert res.returncode == 0, res.stderr[-3000:]
        a, r = _samples(out, "bf16", "addition"), _samples(in_process["bf16"], "bf16", "addition")
        assert set(a) <= set(r) and len(a) == int(LIMIT) and all(a[k]["prediction"] == r[k]["prediction"] for k in a)
        setup = _results(out)["bf16"]
        perf = setup["performance"]
        assert_figures_carry_their_source(perf)
        assert [lv["concurrency"] for lv in perf["levels"]] == [1, 2]
        assert "streaming /v1/completions" in perf["levels"][0]["requests_per_s"]["source"]
        assert any("inter-token latency" in n for n in perf["notes"]), perf["notes"]
        assert setup["quantization"]["server"] == {"mode": "attach", "model": "tiny", "base_url": url}
        assert setup["memory"]["peak_bytes"]["source"].startswith("not measured")
        # the key went out with every request (the server wants it) and into no file of the run
        assert KEY not in res.stdout + res.stderr
        for path in out.rglob("*"):
            assert not path.is_file() or KEY.encode() not in path.read_bytes(), path
        # a server refusing prompt log-probabilities refuses the likelihood tasks at validation, in one line
        one_line_exit_2(run_cli("validate", str(cfg)), "refuses prompt_logprobs log-probabilities")
    finally:
        del os.environ["QEVAL_TEST_API_KEY"]
    with pytest.raises(urllib.error.HTTPError) as denied:  # without the key the server answers nothing
        urllib.request.urlopen(url + "/models", timeout=30)  # noqa: S310
    assert denied.value.code == 401


def test_echo_and_prompt_logprobs_agree_on_a_live_server(attached: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of asking a real vLLM server for prompt log-probabilities (its limit here is one
    top entry per position) give the same numbers for the same token ids."""
    from qeval.backends.openai import scoring
    from qeval.backends.openai.client import Client

    monkeypatch.setattr(scoring, "TOPK", 1)
    client = Client(attached[1], api_key=KEY)
    prompt = [1, 22, 23, 24, 25, 26]
    rows = {
        mode: scoring.positions(client.post("/completions", scoring.logprob_body("tiny", prompt, mode)), mode, prompt)
        for mode in ("prompt_logprobs", "echo")
    }
    a, b = (scoring.window_arrays(rows[m], 1, len(prompt) - 1) for m in ("prompt_logprobs", "echo"))
    for x, y in zip(a, b, strict=True):
        assert x.tolist() == y.tolist()
    assert (a[0] <= a[2][:, 0]).all()  # the top-1 log-prob bounds the actual token's
