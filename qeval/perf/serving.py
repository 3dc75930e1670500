"""`qeval goodput CONFIG`: every setup served on the run's workload and tuned (docs/performance.md,
"Serving the workload"). Engine-agnostic: the backend's serving engine (`BackendEntry.serving`,
qeval/backends/base.py `ServingEngine`; vLLM's in qeval/backends/vllm/serve.py) starts a server
per engine setting of the `serving:` grid (qeval/perf/tune.py searches it) and puts each level's
load on it from a dataset it writes of the workload's requests; qeval's SLO maths
(qeval/perf/slo.py) then read the load generator's per-request figures.

Results go to RUN_DIR/serving.json, rewritten atomically after every setup; a rerun reuses a
setup whose key is unchanged: keyed by content as scoring's results are (`serving_parts`: the
model's and checkpoint's checksums, the trace's bytes, the engine's version, the setup, its engine
arguments, the workload and SLO, the `serving:` block); `force` reuses none."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.backends.base import LoadGenerator, LoadLevel, ServerSetting, ServingEngine
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_json
from qeval.perf import slo as slo_maths
from qeval.perf.tune import Engine, EngineSetting, Search, search, settings_of
from qeval.results.serving import FILE, ServedWorkload, ServingLevel, ServingPick, ServingResults, ServingSetup

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.config.setups import Setup
    from qeval.workload.stats import WorkloadStats
    from qeval.workload.trace import Trace

SERVING_VERSION = "1"


@dataclass(frozen=True)
class ServingRun:
    """What every setup of one `qeval goodput` run is served with: the config, its serving
    engine, the device and dtype, the workload's requests and max-model-len, whether prefix
    caching is on, the tokenizer, and where progress is said."""

    cfg: RunConfig
    engine: ServingEngine
    device: str
    dtype: str
    trace: Trace
    max_model_len: int
    prefix: bool
    tok: Any
    say: Callable[[str], None]

    def engine_args(self, setup: Setup, setting: EngineSetting) -> dict[str, Any]:
        """The setup's engine arguments at one engine setting of the grid."""
        server = ServerSetting(
            self.dtype, self.max_model_len, setting.max_num_seqs, setting.max_num_batched_tokens, self.prefix
        )
        return self.engine.engine_args(self.cfg, setup, self.device, server)


# -- one level ---------------------------------------------------------------------------------


def level_of(
    result: dict[str, Any],
    server: dict[str, Any],
    setting: EngineSetting,
    rate: float,
    targets: dict[str, float],
    percentile: float,
) -> ServingLevel:
    """A level's row: qeval's figures from the load generator's per-request lists (`result`),
    with the server's figures sampled meanwhile (`server`)."""
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
        **server,
    )


# -- the key -----------------------------------------------------------------------------------


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
    trace's bytes (not its path), the serving engine's version, the setup, its engine
    arguments, the workload with its SLO, and the `serving:` block."""
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


# -- one setup --------------------------------------------------------------------------------


def _engine_at(
    run: ServingRun, setup: Setup, work: Path, data: Path, native: float | None, load: LoadGenerator
) -> Engine[ServingLevel]:
    """The search's engine: a server per engine setting, yielding how one rate is measured on it
    (with `native`, the trace's own mean rate, its times are replayed scaled to the rate)."""
    assert run.cfg.serving is not None and run.cfg.workload is not None and run.cfg.workload.slo is not None
    sv, slo = run.cfg.serving, run.cfg.workload.slo
    tokenizer = setup.checkpoint or run.cfg.model.path

    @contextmanager
    def engine(setting: EngineSetting) -> Iterator[Callable[[float], ServingLevel]]:
        args = run.engine_args(setup, setting)
        run.say(f"  {setup.name}: starting {run.engine.name} ({setting.label()})")
        with run.engine.server(run.cfg, args, work / f"server-mns{setting.max_num_seqs}.log") as measure:

            def at(rate: float) -> ServingLevel:
                out = work / f"bench-mns{setting.max_num_seqs}-rate{rate:g}.json"
                scale = native / rate if native is not None else None
                level = LoadLevel(tokenizer, data, sv.requests, rate, sv.seed, slo.targets(), out, scale)
                result, server = measure(load, level)
                return level_of(result, server, setting, rate, level.targets, slo.percentile)

            yield at

    return engine


def _say_level(run: ServingRun, setup: Setup) -> Callable[[EngineSetting, float, ServingLevel], None]:
    """The line said after each level: its goodput, latencies at the SLO's percentile, KV peak."""
    assert run.cfg.workload is not None and run.cfg.workload.slo is not None
    p = f"p{run.cfg.workload.slo.percentile:g}"

    def shown(setting: EngineSetting, rate: float, lv: ServingLevel) -> None:
        kv = f"{lv.kv_usage_peak:.1%}" if lv.kv_usage_peak is not None else "n/a"
        run.say(
            f"  {setup.name} {setting.label()} rate {rate:g}/s: goodput {lv.goodput_rps:.3f}/s, "
            f"{p} TTFT {lv.percentiles_ms['ttft'][p]:,.0f} ms, "
            f"TPOT {lv.percentiles_ms['tpot'][p]:,.1f} ms, KV peak {kv}"
            + ("" if lv.meets_slo else f"; breaks the SLO ({'; '.join(lv.violations)})")
        )

    return shown


def _found_into(row: ServingSetup, run: ServingRun, setup: Setup, found: Search[ServingLevel]) -> None:
    """The search's levels and pick (or, with none meeting the SLO, the best latencies) into `row`."""
    assert run.cfg.workload is not None and run.cfg.workload.slo is not None
    slo = run.cfg.workload.slo
    row.status = "ok"
    row.levels = [lv for _, _, lv in found.levels]
    row.restarts, row.bound_restarts, row.bound_levels = found.restarts, found.bound_restarts, found.bound_levels
    if found.pick is None:
        p = f"p{slo.percentile:g}"
        targets = slo.targets()
        row.best_p99_ms = {k: min(lv.percentiles_ms[slo_maths.FIGURE_OF[k]][p] for lv in row.levels) for k in targets}
        return
    setting, rate, lv = found.levels[found.pick]
    row.pick = ServingPick(
        max_num_seqs=setting.max_num_seqs,
        max_num_batched_tokens=setting.max_num_batched_tokens,
        rate=rate,
        goodput_rps=lv.goodput_rps,
    )
    row.serve_command = run.engine.command(run.engine_args(setup, setting))


def serve_setup(run: ServingRun, setup: Setup, work: Path, key: str, load: LoadGenerator) -> ServingSetup:
    """Tune one setup (qeval/perf/tune.py) and record every level; a failure is the setup's result."""
    assert run.cfg.serving is not None
    sv = run.cfg.serving
    t0 = time.time()
    settings = settings_of(sv.max_num_seqs, sv.max_num_batched_tokens)
    data = work / "dataset.jsonl"
    native = run.engine.write_dataset(run.trace, run.tok, sv, run.max_model_len, data)
    row = ServingSetup(
        setup=setup.name,
        key=key,
        status="failed",
        max_model_len=run.max_model_len,
        prefix_caching=run.prefix,
        serve_command=run.engine.command(run.engine_args(setup, settings[0])),
    )
    engine = _engine_at(run, setup, work, data, native, load)
    try:
        found = search(settings, sv.rates, engine, sv.kv_usage_limit, sv.exhaustive, _say_level(run, setup))
    except Exception as exc:  # noqa: BLE001 - the setup's failure, one line; the others go on
        row.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    else:
        _found_into(row, run, setup, found)
    row.seconds = round(time.time() - t0, 1)
    return row


# -- the whole run ----------------------------------------------------------------------------


def check_goodput(cfg: RunConfig) -> ServingEngine:
    """What `qeval goodput` refuses in one line before anything else (checkpoints looked up,
    tokenizer loaded, engines started): the blocks it needs, the config's backend blocks against
    the backend's entry (backends.check_blocks) and a backend with a server to tune
    (`check_vllm` asks whether its engine is installed); the serving engine."""
    if cfg.workload is None or cfg.workload.slo is None or cfg.serving is None:
        raise UserError(f"{cfg.name}: qeval goodput needs a workload: block with an slo: and a serving: block")
    from qeval.backends import check_blocks, serving_engine

    check_blocks(cfg)
    engine = serving_engine(cfg)
    if engine is None:
        raise UserError(
            f"{cfg.name}: qeval goodput serves each setup with `vllm serve`: backend vllm, or openai "
            "with server.mode launch and no command (the hf backend has no server to load)"
        )
    return engine


def check_vllm(cfg: RunConfig) -> None:
    """The engine installed where the servers and the load generator run (the backend's
    `check_install`: .venv-vllm, QEVAL_VLLM_PYTHON), one line if not: `qeval goodput` asks before
    anything loads; `qeval run`'s preflight asks it for every config on vLLM."""
    from qeval.backends import backend_entry

    backend_entry(cfg.backend).check_install(cfg)


def _tokenizer(path: str) -> Any:
    """The model's tokenizer; a folder without one, or a hub id offline, is bad input (one line)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: cannot load the tokenizer: {first}") from None


def _read_trace(cfg: RunConfig) -> tuple[Trace, str | None]:
    """The workload's requests and its trace's sha256. The trace's key is the content measured:
    hashed before and after it is read (tokenizing a large trace takes minutes), so a trace
    rewritten meanwhile is refused, not stored under the new bytes' key with the old bytes' figures."""
    from qeval.workload.draw import requests_of
    from qeval.workload.tokens import TokenCounter

    assert cfg.workload is not None
    workload = cfg.workload
    trace_sha = _digest(workload.trace)
    trace = requests_of(workload, TokenCounter(cfg.model.path), cfg.model.max_context)  # refuses an unreadable one
    if _digest(workload.trace) != trace_sha:
        raise UserError(f"{workload.trace}: the trace changed while it was read; run again")
    return trace, trace_sha


def _stored(file: Path) -> dict[str, ServingSetup]:
    """The rows of an earlier serving.json that were served, by setup."""
    if not file.is_file():
        return {}
    from qeval.results.serving import read_serving

    return {s.setup: s for s in read_serving(file).setups if s.status == "ok"}


def _workload_block(cfg: RunConfig, trace: Trace, stats: WorkloadStats, prefix: bool) -> ServedWorkload:
    """serving.json's `workload` block: what was replayed, how, and its plan."""
    assert cfg.serving is not None and cfg.workload is not None and cfg.workload.slo is not None
    sv = cfg.serving
    return ServedWorkload(
        source=trace.source,
        requests_per_level=sv.requests,
        trace_requests=stats.requests,
        max_model_len=stats.max_model_len,
        percentile=stats.percentile,
        refused=stats.refused,
        refused_share=stats.refused_share,
        arrivals=(
            f"Poisson (seed {sv.seed}) at each rate; the trace's own times are not replayed"
            if sv.arrivals == "poisson"
            else f"the workload's own arrival times ({trace.arrivals or 'the trace'}), scaled to each "
            "rate (vllm bench serve --dataset-name timed_trace)"
        ),
        rates=sv.rates,
        prefix_caching=prefix,
        slo=cfg.workload.slo.model_dump(mode="json", exclude_none=True),
    )


def _results_of(run: ServingRun, version: str, stats: WorkloadStats) -> ServingResults:
    """serving.json before any setup is served: the load generator, the machine, the workload."""
    cfg, device = run.cfg, run.device
    assert cfg.serving is not None
    cpu_note = (
        f"the measured servers reserved {cfg.engine.cpu_memory_utilization:g} "
        "of host memory (the CPU build's --gpu-memory-utilization)"
    )
    return ServingResults(
        config=cfg.name,
        load_generator=run.engine.load_generator_label(version),
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs" if device == "cpu" else device,
        kv_usage_limit=cfg.serving.kv_usage_limit,
        workload=_workload_block(cfg, run.trace, stats, run.prefix),
        notes=[f"dtype {run.dtype} on {device}"] + ([cpu_note] if device == "cpu" else []),
    )


def _prepare(cfg: RunConfig, say: Callable[[str], None]) -> tuple[ServingRun, str, WorkloadStats, str | None]:
    """Everything checked and loaded before any server starts: the run's serving context, the
    engine's version, the workload's plan and the trace's sha256."""
    from qeval.backends.device import dtype_for, resolve_device
    from qeval.workload.stats import summarize

    engine = check_goodput(cfg)
    assert cfg.workload is not None and cfg.serving is not None
    device = resolve_device(cfg.device)
    engine.check_setups(cfg, device)
    dtype = dtype_for(cfg.model.dtype, Path(cfg.model.path), device)
    tok = _tokenizer(cfg.model.path)
    trace, trace_sha = _read_trace(cfg)
    version = engine.version(cfg)
    block = engine.block_size(device)
    stats = summarize(trace, cfg.workload.max_model_len_percentile, block, cfg.model.max_context)
    engine.check_arrivals(trace, cfg.serving, stats.max_model_len)  # checked before any engine starts
    prefix = stats.prefix is not None and stats.prefix.blocks_saved > 0
    run = ServingRun(cfg, engine, device, dtype, trace, stats.max_model_len, prefix, tok, say)
    return run, version, stats, trace_sha


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
    `model_sha256`, its checkpoint's in `checkpoint_sha256`, the trace's bytes, the engine's
    version…), and never under `force`."""
    from qeval.perf.rank import recommend_goodput

    run, version, stats, trace_sha = _prepare(cfg, say)
    assert cfg.serving is not None and cfg.workload is not None and cfg.workload.slo is not None
    out.mkdir(parents=True, exist_ok=True)
    file = out / FILE
    old = {} if force else _stored(file)
    results = _results_of(run, version, stats)
    first = settings_of(cfg.serving.max_num_seqs, cfg.serving.max_num_batched_tokens)[0]
    load: LoadGenerator | None = None
    try:
        for setup in cfg.setups:
            parts = serving_parts(
                cfg,
                setup,
                run.engine_args(setup, first),
                model_sha256,
                version,
                (checkpoint_sha256 or {}).get(setup.name),
                trace_sha,
            )
            load = _serve_one(run, setup, serving_key(parts), old, out, results, load)
            atomic_write_json(file, results.model_dump(mode="json"))
    finally:
        if load is not None:
            load.close()
    results.recommendation = recommend_goodput(results.setups, gated, cfg.workload.slo)
    atomic_write_json(file, results.model_dump(mode="json"))
    return results


def _serve_one(
    run: ServingRun,
    setup: Setup,
    key: str,
    old: dict[str, ServingSetup],
    out: Path,
    results: ServingResults,
    load: LoadGenerator | None,
) -> LoadGenerator | None:
    """One setup's row into `results`: the stored one under the same key, else served; the load
    generator (started before the first server: its start overlaps the engine's)."""
    assert run.cfg.serving is not None
    if setup.name in old and old[setup.name].key == key:
        run.say(f"{setup.name}: reused from {out / FILE} (same key)")
        results.setups.append(old[setup.name])
        return load
    run.say(
        f"{setup.name}: serving the workload ({run.max_model_len} max-model-len, rates "
        f"{', '.join(f'{r:g}' for r in run.cfg.serving.rates)}/s)"
    )
    work = out / "serving"
    (work / setup.name).mkdir(parents=True, exist_ok=True)
    if load is None:
        load = run.engine.start_load(run.cfg, work / "bench.log")
    results.setups.append(serve_setup(run, setup, work / setup.name, key, load))
    return load
