"""The load `qeval goodput` puts on a `vllm serve` server, and what it reads back: `vllm bench
serve` (qeval/backends/vllm/bench_serve.py, one process for the whole run) replaying a dataset
(qeval/backends/vllm/serve_data.py) at one rate per level, and the server's /metrics sampled
while it runs: KV-cache usage, preemptions, queueing time."""

from __future__ import annotations

import functools
import json
import os
import select
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qeval.backends.openai.metrics import parse_prometheus

#: a level's bench may run this long at most (a CPU engine at a high rate queues for minutes)
BENCH_TIMEOUT_S = 900
#: seconds between /metrics samples while a level runs
SAMPLE_EVERY_S = 0.1
LOAD_GENERATOR = (
    "vllm bench serve (vllm.benchmarks.serve.main, vLLM {version}): --dataset-name custom "
    "--custom-output-len -1 --skip-chat-template --disable-shuffle --ignore-eos --request-rate R "
    "(Poisson, --seed) --save-detailed"
)
#: the SLO targets as `vllm bench serve --goodput` names them
_GOODPUT_KEYS = (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2el"))


# -- the bench's arguments --------------------------------------------------------------------


def _load_args(data: Path, rate: float, time_scale: float | None) -> list[str]:
    """The dataset and its arrivals: the custom dataset at a Poisson `rate`, or with `time_scale`
    the timed_trace dataset, its timestamps multiplied by `time_scale`."""
    if time_scale is not None:
        return [
            "--dataset-name",
            "timed_trace",
            "--dataset-path",
            str(data),
            "--timed-trace-sec-multiplier",
            f"{time_scale:.9g}",
        ]
    return [
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(data),
        "--custom-output-len",
        "-1",
        "--skip-chat-template",
        "--disable-shuffle",
        "--request-rate",
        f"{rate:g}",
    ]


def _result_args(out: Path) -> list[str]:
    """The figures the bench computes and where it writes them (per request: --save-detailed)."""
    return [
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
    ]


def bench_argv(
    port: int,
    tokenizer: str,
    data: Path,
    n: int,
    rate: float,
    seed: int,
    targets: dict[str, float],
    out: Path,
    time_scale: float | None = None,
) -> list[str]:
    """`vllm bench serve`'s arguments for one level (vLLM 0.32.0's option names): the custom
    dataset at a Poisson `rate`, or with `time_scale` the timed_trace dataset, its timestamps
    multiplied by `time_scale` (--timed-trace-sec-multiplier; the bench's own replay, self-timed)."""
    goodput = [f"{k}:{targets[q]:g}" for q, k in _GOODPUT_KEYS if q in targets]
    server = ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions"]
    model = ["--model", tokenizer, "--served-model-name", "qeval"]
    requests = ["--num-prompts", str(n), "--seed", str(seed), "--ignore-eos", "--temperature", "0"]
    argv = [*server, *model, *_load_args(data, rate, time_scale), *requests, *_result_args(out)]
    return argv + (["--goodput", *goodput] if goodput else [])


# -- the bench's process ----------------------------------------------------------------------


class BenchRunner:
    """One `python -m qeval.backends.vllm.bench_serve --serve-stdin` process in vLLM's interpreter for
    the whole run: started before the first server so that vLLM's import (a minute on a loaded
    CPU) overlaps the engine's start; each level is one argument list sent to it."""

    def __init__(self, python: str, log: Path) -> None:
        from qeval.files.processes import die_with_parent

        read, write = os.pipe()
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [python, "-m", "qeval.backends.vllm.bench_serve", "--serve-stdin", str(write)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=(write,),
            # PYTHONHASHSEED: timed_trace draws each prompt chunk seeded by hash(str)
            env=os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"},
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        os.close(write)
        self._status = os.fdopen(read)
        self.log = log
        self._ready = False

    def _line(self, timeout_s: float) -> str:
        ready, _, _ = select.select([self._status], [], [], timeout_s)
        line = self._status.readline() if ready else ""
        if not line:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"vllm bench serve {'timed out' if not ready else 'exited'}: {' | '.join(tail)} (log: {self.log})"
            )
        return line.strip()

    def run(self, argv: list[str], timeout_s: float = BENCH_TIMEOUT_S) -> None:
        """One `vllm bench serve` run with `argv`; RuntimeError naming its error."""
        if not self._ready:
            self._line(600)  # "ready": vLLM imported
            self._ready = True
        assert self.proc.stdin is not None  # opened with PIPE
        self.proc.stdin.write((json.dumps(argv) + "\n").encode())
        self.proc.stdin.flush()
        answer = self._line(timeout_s)
        if answer != "ok":
            raise RuntimeError(f"vllm bench serve failed: {answer} (log: {self.log})")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._status.close()
        self._log.close()


# -- the server's /metrics while a level runs ---------------------------------------------------


class MetricsSampler:
    """Samples GET /metrics every SAMPLE_EVERY_S on a thread: KV usage while requests run,
    preemptions and the queue-time histogram at the start and the end."""

    def __init__(self, get: Callable[[], str]) -> None:
        self._get = get
        self._stop = threading.Event()
        self.usage: list[float] = []
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> dict[str, float]:
        try:
            text = self._get()
        except Exception:  # noqa: BLE001 - a missed sample is a missed sample
            return {}
        out: dict[str, float] = {}
        for name, _, value in parse_prometheus(text):
            if name in (
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm:num_requests_running",
                "vllm:num_preemptions_total",
                "vllm:request_queue_time_seconds_sum",
                "vllm:request_queue_time_seconds_count",
            ) and np.isfinite(value):
                out[name] = out.get(name, 0.0) + value  # summed over engines/labels
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = self._read()
            if s:
                self.first = self.first or s
                self.last = s
                usage = s.get("vllm:kv_cache_usage_perc", s.get("vllm:gpu_cache_usage_perc"))
                if usage is not None and 0 <= usage <= 1 and s.get("vllm:num_requests_running", 0) > 0:
                    self.usage.append(usage)
            self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> MetricsSampler:
        self.first = self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        end = self._read()
        self.last = end or self.last

    def delta(self, name: str) -> float | None:
        if name not in self.first or name not in self.last:
            return None
        return self.last[name] - self.first[name]

    def figures(self) -> dict[str, Any]:
        """kv_usage_peak/mean, preemptions, queue_time_mean_ms, kv_samples."""
        pre = self.delta("vllm:num_preemptions_total")
        q_sum = self.delta("vllm:request_queue_time_seconds_sum")
        q_n = self.delta("vllm:request_queue_time_seconds_count")
        return {
            "kv_usage_peak": round(max(self.usage), 4) if self.usage else None,
            "kv_usage_mean": round(float(np.mean(self.usage)), 4) if self.usage else None,
            "preemptions": int(pre) if pre is not None else None,
            "queue_time_mean_ms": round(q_sum / q_n * 1e3, 3) if q_sum is not None and q_n else None,
            "kv_samples": len(self.usage),
        }
