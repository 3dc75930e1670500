"""`qeval goodput` (issue 41): the SLO and goodput maths, the tuner's search on synthetic
measurements, the `vllm serve` command line, the recommendation by goodput, the serving
config's checks, the report; and one slow test through the real vLLM CPU engine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from qeval.backends.vllm.serve_cmd import serve_command
from qeval.config import RunConfig
from qeval.config.workload import SloSpec
from qeval.perf import slo as S
from qeval.perf.rank import goodput_interval, recommend_goodput
from qeval.perf.tune import EngineSetting, best, replay, search, settings_of
from qeval.results.serving import ServingLevel, ServingPick, ServingResults, ServingSetup
from tests.helpers import ROOT, one_line_exit_2, run_cli


def _detailed(
    ttfts: list[float], latencies: list[float], outs: list[int], errors: list[str] | None = None
) -> dict[str, Any]:
    n = len(ttfts)
    return {
        "ttfts": ttfts,
        "latencies": latencies,
        "output_lens": outs,
        "input_lens": [10] * n,
        "itls": [[(lat - t) / max(o - 1, 1)] * max(o - 1, 0) for t, lat, o in zip(ttfts, latencies, outs, strict=True)],
        "errors": errors or [""] * n,
    }


def test_tpot_and_goodput_follow_vllm_rules() -> None:
    # request 0: ttft 0.1, tpot (1.1 - 0.1) / 10 = 0.1 -> good at ttft<=200, tpot<=100 (<= counts)
    # request 1: ttft 0.3 -> not good; request 2: tpot (2.1 - 0.1) / 10 = 0.2 -> not good; request 3 failed
    res = _detailed([0.1, 0.3, 0.1, 0.0], [1.1, 1.3, 2.1, 0.0], [11, 11, 11, 0], ["", "", "", "boom"])
    reqs = S.requests_of_detailed(res)
    assert [r.ok for r in reqs] == [True, True, True, False]
    assert reqs[2].tpot == pytest.approx(0.2)
    fig = S.level_figures(reqs, 4.0, {"ttft_ms": 200.0, "tpot_ms": 100.0}, 99)
    assert fig.good == 1 and fig.goodput_rps == pytest.approx(0.25)
    assert fig.completed == 3 and fig.failed == 1 and fig.throughput_rps == pytest.approx(0.75)
    assert not fig.meets_slo and any("failed" in v for v in fig.violations)


def test_percentiles_are_numpy_linear_and_the_verdict_uses_the_slo_percentile() -> None:
    ttfts = [i / 100 for i in range(1, 101)]  # 10 ms .. 1000 ms
    reqs = S.requests_of_detailed(_detailed(ttfts, [t + 0.5 for t in ttfts], [6] * 100))
    fig = S.level_figures(reqs, 10.0, {"ttft_ms": 950.0}, 90)
    assert fig.percentiles_ms["ttft"]["p90"] == pytest.approx(np.percentile(ttfts, 90) * 1e3)
    assert fig.percentiles_ms["ttft"]["p99"] == pytest.approx(np.percentile(ttfts, 99) * 1e3)
    assert fig.meets_slo  # p90 is 901 ms
    assert fig.good == 95  # per request: 10..950 ms
    fig99 = S.level_figures(reqs, 10.0, {"ttft_ms": 950.0}, 99)
    assert not fig99.meets_slo and fig99.violations[0].startswith("p99 TTFT")


def test_one_token_outputs_have_no_tpot_in_the_verdict_but_pass_goodput() -> None:
    reqs = S.requests_of_detailed(_detailed([0.1, 0.1], [0.1, 0.1], [1, 1]))
    fig = S.level_figures(reqs, 1.0, {"tpot_ms": 1.0}, 99)
    assert fig.good == 2  # vLLM: tpot 0 for one-token outputs
    assert not fig.meets_slo and "no TPOT measured" in fig.violations


def test_slo_targets_are_printed_with_their_digits() -> None:
    """A sub-millisecond or fractional target reads as given ("> 0.5 ms"), not rounded to a
    whole millisecond ("52.5 ms > 0 ms")."""
    reqs = S.requests_of_detailed(_detailed([0.0525, 0.0525], [0.1, 0.1], [5, 5]))
    fig = S.level_figures(reqs, 1.0, {"ttft_ms": 0.4, "e2e_ms": 4000.0}, 99)
    assert fig.violations == ["p99 TTFT 52.5 ms > 0.4 ms"]
    rec = recommend_goodput([_row("a", None)], None, SloSpec(ttft_ms=0.25, tpot_ms=1500))
    assert "TTFT <= 0.25 ms, 99th-percentile TPOT <= 1,500 ms" in rec.reasons["a"]


@dataclass
class Fake:
    goodput_rps: float
    meets_slo: bool
    kv_usage_peak: float | None


def _table() -> dict[tuple[int, float], Fake]:
    # max-num-seqs 4 saturates early; 16 holds rate 2 but its KV at rate 4 is over 90%; 64 breaks at 2
    return {
        (4, 1.0): Fake(0.9, True, 0.3),
        (4, 2.0): Fake(1.1, False, 0.4),
        (4, 4.0): Fake(1.2, True, 0.4),
        (16, 1.0): Fake(1.0, True, 0.4),
        (16, 2.0): Fake(1.9, True, 0.7),
        (16, 4.0): Fake(3.0, True, 0.95),
        (64, 1.0): Fake(1.0, True, 0.5),
        (64, 2.0): Fake(1.5, False, 0.99),
        (64, 4.0): Fake(0.5, False, 1.0),
    }


def test_tuner_stops_at_the_first_broken_level_and_picks_the_best_admissible() -> None:
    settings = settings_of([64, 4, 16], [None])
    found = search(settings, [4.0, 1.0, 2.0], replay(_table()), 0.9)
    measured = [(s.max_num_seqs, r) for s, r, _ in found.levels]
    # 4: breaks at 2 (the later 4.0 "met" is never run); 16: 4.0 breaks the KV limit; 64: breaks at 2
    assert measured == [(4, 1.0), (4, 2.0), (16, 1.0), (16, 2.0), (16, 4.0), (64, 1.0), (64, 2.0)]
    assert found.restarts == 3 and found.bound_restarts == 3 and found.bound_levels == 9
    assert found.pick is not None
    s, r, lv = found.levels[found.pick]
    assert (s.max_num_seqs, r, lv.goodput_rps) == (16, 2.0, 1.9)


def test_tuner_pick_matches_the_exhaustive_sweeps_best_here_and_none_when_nothing_meets() -> None:
    table = _table()
    full = search(settings_of([4, 16, 64], [None]), [1.0, 2.0, 4.0], replay(table), 0.9, exhaustive=True)
    assert len(full.levels) == 9 and full.pick is not None
    # exhaustive finds (4, 4.0) admissible (1.2/s) but 16 @ 2.0 is still the best
    assert full.levels[full.pick][0].max_num_seqs == 16 and full.levels[full.pick][1] == 2.0
    bad = {k: Fake(v.goodput_rps, False, v.kv_usage_peak) for k, v in table.items()}
    assert search(settings_of([4], [None]), [1.0, 2.0], replay(bad), 0.9).pick is None
    # ties go to fewer max-num-seqs
    tie = [(EngineSetting(16), 1.0, Fake(1.0, True, 0.1)), (EngineSetting(4), 1.0, Fake(1.0, True, 0.1))]
    assert best(tie, 0.9) == 1


def test_a_level_whose_kv_usage_was_not_sampled_is_judged_on_the_slo_alone() -> None:
    """Issue 54 item 2: on a light level every /metrics scrape can miss the running requests
    (kv_usage_peak None). That reading is not measured: the level that meets the SLO is
    admissible, the sweep goes on, and the pick can be it."""
    table = {(4, 0.5): Fake(0.49, True, None), (4, 1.0): Fake(0.99, True, None), (4, 2.0): Fake(1.2, False, None)}
    found = search(settings_of([4], [None]), [0.5, 1.0, 2.0], replay(table), 0.9)
    assert [r for _, r, _ in found.levels] == [0.5, 1.0, 2.0]  # not stopped at the first unsampled level
    assert found.pick is not None and found.levels[found.pick][1] == 1.0
    assert best([(EngineSetting(4), 1.0, Fake(1.0, True, None))], 0.9) == 0
    # a measured peak over the limit still stops the sweep and is never picked
    over = {(4, 0.5): Fake(0.49, True, None), (4, 1.0): Fake(0.99, True, 0.95), (4, 2.0): Fake(1.5, True, 0.5)}
    found = search(settings_of([4], [None]), [0.5, 1.0, 2.0], replay(over), 0.9)
    assert [r for _, r, _ in found.levels] == [0.5, 1.0] and found.levels[found.pick or 0][1] == 0.5


def test_serve_command_line() -> None:
    args = {
        "model": "/ckpt/my model-w8a8",
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "gpu_memory_utilization": 0.9,
        "kv_cache_dtype": "fp8",
        "quantization": "fp8",
        "enable_prefix_caching": True,
        "seed": 0,
        "enforce_eager": True,
        "tensor_parallel_size": 1,
        "max_num_batched_tokens": None,
    }
    cmd = serve_command(args)
    assert cmd == (
        "vllm serve '/ckpt/my model-w8a8' --dtype bfloat16 --max-model-len 1024 --max-num-seqs 16 "
        "--gpu-memory-utilization 0.9 --kv-cache-dtype fp8 --quantization fp8 --enable-prefix-caching"
    )
    assert "--enable-prefix-caching" not in serve_command(args | {"enable_prefix_caching": False})
    assert "--dtype" not in serve_command(args | {"dtype": "auto"})


def _level(goodput: float, meets: bool, p99: float) -> ServingLevel:
    pc = {k: {"p50": p99 / 2, "p90": p99 * 0.9, "p99": p99} for k in ("ttft", "tpot", "itl", "e2e")}
    return ServingLevel(
        max_num_seqs=8,
        rate=1.0,
        requests=10,
        completed=10,
        failed=0,
        duration_s=10.0,
        goodput_rps=goodput,
        throughput_rps=1.0,
        output_tokens_per_s=50.0,
        percentiles_ms=pc,
        meets_slo=meets,
        kv_usage_peak=0.5,
    )


def _row(name: str, goodput: float | None, p99: float = 100.0) -> ServingSetup:
    pick = ServingPick(max_num_seqs=8, rate=1.0, goodput_rps=goodput) if goodput is not None else None
    return ServingSetup(
        setup=name,
        key="k",
        status="ok",
        max_model_len=1024,
        prefix_caching=False,
        levels=[_level(goodput or 0.0, goodput is not None, p99)],
        pick=pick,
        best_p99_ms={} if pick else {"ttft_ms": p99},
        serve_command=f"vllm serve {name}",
    )


def test_recommend_by_goodput() -> None:
    slo = SloSpec(ttft_ms=500)
    rows = [_row("bf16", 1.0), _row("int8", 1.9), _row("int4", None, 812.5), _row("kv", 5.0)]
    rec = recommend_goodput(rows, (["bf16", "int8", "int4"], {"kv": "kv: fails the gate on facts"}), slo)
    assert rec.setup == "int8" and rec.gates_checked
    assert "recommended (by goodput)" in rec.reasons["int8"] and "1.900 requests/s" in rec.reasons["int8"]
    assert "0.53x int8's goodput" in rec.reasons["bf16"]
    assert "cannot meet the SLO" in rec.reasons["int4"] and "TTFT 812.5 ms" in rec.reasons["int4"]
    assert rec.reasons["kv"] == "kv: fails the gate on facts"  # the highest goodput, but out by the gates
    ungated = recommend_goodput(rows, None, slo)
    assert ungated.setup == "kv" and "quality gates not checked" in ungated.reasons["kv"]
    assert recommend_goodput([_row("int4", None)], None, slo).setup is None


def test_serving_config_checks(tmp_path: Path) -> None:
    base = yaml.safe_load((ROOT / "configs" / "smollm2-goodput.yaml").read_text())
    base["model"]["path"] = str(ROOT / "models" / "smollm2-135m")
    base["workload"]["trace"] = str(ROOT / "configs" / "workloads" / "gsm8k.jsonl")
    cfg = RunConfig.model_validate(base)
    assert cfg.serving is not None and cfg.serving.rates == [0.25, 0.5, 1.0]
    no_slo = base | {"workload": {k: v for k, v in base["workload"].items() if k != "slo"}}
    with pytest.raises(ValueError, match="serving: needs a workload"):
        RunConfig.model_validate(no_slo)
    with pytest.raises(ValueError, match="rate is listed twice"):
        RunConfig.model_validate(base | {"serving": {"rates": [1, 1]}})
    # unset, the serving block stays out of the config hash (stored runs keep their keys)
    plain = {k: v for k, v in base.items() if k not in ("serving", "recommend_by")}
    assert "serving" not in RunConfig.model_validate(plain).as_json()


def test_bad_serving_block_is_one_line_exit_2(tmp_path: Path) -> None:
    base = yaml.safe_load((ROOT / "configs" / "smollm2-goodput.yaml").read_text())
    base["model"]["path"] = str(ROOT / "models" / "smollm2-135m")
    base["workload"]["trace"] = str(ROOT / "configs" / "workloads" / "gsm8k.jsonl")
    base["serving"]["rates"] = [0]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base))
    res = run_cli("goodput", str(path), "--output", str(tmp_path / "out"))
    assert res.returncode == 2 and "rates" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_goodput_on_the_vllm_cpu_engine(tmp_path: Path) -> None:
    """One tiny `vllm serve` (qeval-tiny), two load levels of 6 requests from a drawn workload
    through `vllm bench serve`, replayed at the workload's own (drawn Poisson) arrival times scaled
    to each rate: goodput, percentiles and KV usage recorded, qeval's goodput equal
    to the bench's own, the serve command carrying the tuned flags; a rerun reuses the setup."""
    cfg = {
        "name": "gp",
        "model": {"path": str(ROOT / "models" / "qeval-tiny"), "dtype": "auto", "max_context": 256},
        "backend": "openai",
        "server": {"mode": "launch"},
        "device": "cpu",
        "engine": {"enforce_eager": True, "cpu_memory_utilization": 0.05},
        "setups": [{"name": "base", "baseline": True}],
        "tasks": ["addition"],
        "workload": {
            "input": {"family": "uniform", "min": 20, "max": 60},
            "output": {"family": "fixed", "value": 32},
            "arrival_rate": 2,
            "requests": 40,
            "slo": {"percentile": 99, "ttft_ms": 20000, "tpot_ms": 2000},
        },
        # the workload's own arrival times replayed (timed_trace); the Poisson path's argv: test_bench_argv
        "serving": {"rates": [1, 4], "max_num_seqs": [4], "requests": 6, "arrivals": "trace"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    res = run_cli("goodput", str(path), "--output", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    data = ServingResults.model_validate(json.loads((out / "serving.json").read_text()))
    [row] = data.setups
    assert row.status == "ok" and row.restarts == 1 and [lv.rate for lv in row.levels] == [1.0, 4.0]
    assert row.max_model_len == 128  # p99 of 21..92 tokens, rounded up to the CPU build's 128-token blocks
    for lv in row.levels:
        assert lv.completed == 6 and lv.failed == 0 and lv.meets_slo
        assert lv.vllm_goodput_rps == pytest.approx(lv.goodput_rps, abs=1e-3)
        assert 0 < lv.percentiles_ms["ttft"]["p50"] <= lv.percentiles_ms["ttft"]["p99"]
        assert lv.preemptions == 0 and (lv.kv_usage_peak is None) == (lv.kv_samples == 0)
        assert lv.kv_usage_peak is None or 0 < lv.kv_usage_peak < 1
    # KV usage is sampled from /metrics every 0.1 s while a request runs; on a loaded 2-core machine
    # a level's scrapes can all miss (seen in CI at rate 4 and once at rate 1: kv_samples 0), which
    # qeval reports as not measured and never counts against the level (issue 54 item 2: the tuner's
    # tests). A sampler that never reads the engine's figure (a renamed metric) misses every level
    assert any(lv.kv_usage_peak is not None for lv in row.levels), [lv.kv_samples for lv in row.levels]
    assert (
        data.workload.arrivals is not None
        and "timed_trace" in data.workload.arrivals
        and "Poisson at 2 requests/s" in data.workload.arrivals
    )
    assert row.pick is not None and data.recommendation.setup == "base"
    assert "--max-num-seqs 4" in row.serve_command and "--max-model-len 128" in row.serve_command
    assert "vllm serve" in res.stdout and (out / "serving.md").is_file() and (out / "serving-kv.svg").is_file()
    again = run_cli("goodput", str(path), "--output", str(out), timeout=300)
    assert again.returncode == 0 and "reused" in again.stdout


def test_report_and_notebook_tables(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from qeval.files.atomic import atomic_write_json
    from qeval.notebook import Run
    from qeval.report.serving import FIGURES, write_report

    slo = SloSpec(ttft_ms=500)
    rows = [_row("bf16", 1.0), _row("int4", None, 812.5)]
    res = ServingResults(
        config="c",
        workload={"source": "t.jsonl", "slo": {"percentile": 99, "ttft_ms": 500}},
        load_generator="vllm bench serve",
        machine="cpu",
        kv_usage_limit=0.9,
        setups=rows,
        recommendation=recommend_goodput(rows, None, slo),
    )
    atomic_write_json(tmp_path / "serving.json", res.model_dump(mode="json"))
    md = write_report(res, tmp_path).read_text()
    assert "**Recommendation (by goodput):** bf16" in md and "    vllm serve int4" in md
    assert "cannot meet the SLO" in md and "TTFT 812.5 ms" in md
    assert all((tmp_path / f).read_text().startswith("<svg") for f in FIGURES)
    levels = Run.serving(SimpleNamespace(path=tmp_path))  # type: ignore[arg-type]
    assert list(levels["setup"]) == ["bf16", "int4"] and levels["ttft_p99_ms"].tolist() == [100.0, 812.5]
    setups = Run.serving(SimpleNamespace(path=tmp_path), "setups")  # type: ignore[arg-type]
    assert setups["recommended"].tolist() == [True, False] and setups["goodput_rps"].tolist()[0] == 1.0


def test_report_md_says_where_goodput_is_measured() -> None:
    from qeval.report.serving import workload_note

    assert workload_note({"backend": "vllm"}) is None
    note = workload_note({"backend": "hf", "workload": {"trace": "t.jsonl"}})
    assert note is not None and note.startswith("workload: this run measured no goodput") and "qeval goodput" in note
    assert workload_note({"backend": "vllm", "workload": {"trace": "t"}, "recommend_by": "goodput"}) is None


def test_goodput_needs_a_backend_that_serves_vllm(tmp_path: Path) -> None:
    """recommend_by goodput on the hf backend, or on an attached server: one line, exit 2, before
    anything loads (the backend's registry entry says whether it serves `vllm serve`)."""
    base = yaml.safe_load((ROOT / "configs" / "smollm2-goodput.yaml").read_text())
    base["model"]["path"] = str(ROOT / "models" / "qeval-tiny")
    base["workload"]["trace"] = str(ROOT / "configs" / "workloads" / "gsm8k.jsonl")
    base["model"]["max_context"] = 256
    hf = {k: v for k, v in base.items() if k != "server"} | {"backend": "hf"}
    attached = base | {"server": {"mode": "attach", "base_url": "http://127.0.0.1:9/v1", "model": "qeval"}}
    no_serving = {k: v for k, v in base.items() if k != "serving"}
    for cfg, message in (
        (hf, "recommend_by goodput serves each setup with `vllm serve`"),
        (attached, "recommend_by goodput serves each setup with `vllm serve`"),
        (no_serving, "needs a workload: block with an slo: and a serving: block"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(cfg))
        one_line_exit_2(run_cli("validate", str(path)), message)


def test_goodput_checks_the_backend_blocks_before_asking_for_checkpoints(tmp_path: Path) -> None:
    """`qeval goodput` on a config whose backend would ignore a block (a `server:` block on hf or
    vllm, performance.from_workload on vllm), or names no backend qeval has, says so in one line,
    exit 2, before it looks for the W8A8 checkpoint (not "run `qeval quantize` first", only to
    refuse the config after a quantization)."""
    base = yaml.safe_load((ROOT / "configs" / "smollm2-goodput.yaml").read_text())
    base["model"]["path"] = str(ROOT / "models" / "qeval-tiny")
    base["model"]["max_context"] = 256
    base["budget"]["context_len"] = 256
    base["workload"]["trace"] = str(ROOT / "configs" / "workloads" / "gsm8k.jsonl")
    no_server = {k: v for k, v in base.items() if k != "server"}
    for cfg, message in (
        (base | {"backend": "hf"}, "server: applies to backend openai only (this config's backend is hf)"),
        (base | {"backend": "vllm"}, "server: applies to backend openai only (this config's backend is vllm)"),
        (no_server | {"backend": "hf"}, "qeval goodput serves each setup with `vllm serve`"),
        (
            no_server | {"backend": "vllm", "performance": {"enabled": True, "from_workload": True}},
            "performance.from_workload: backend vllm does not time waves",
        ),
        (no_server | {"backend": "vlm"}, "backend: 'vlm' is not a backend qeval has"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(cfg))
        one_line_exit_2(run_cli("goodput", str(path), "--output", str(tmp_path / "out")), message)


def test_bench_argv_poisson_and_timed_trace(tmp_path: Path) -> None:
    from qeval.backends.vllm.serve_load import bench_argv

    targets = {"ttft_ms": 500.0, "tpot_ms": 50.0}
    poisson = bench_argv(8000, "m", tmp_path / "d.jsonl", 12, 2.0, 0, targets, tmp_path / "o.json")
    assert poisson[poisson.index("--dataset-name") + 1] == "custom"
    assert poisson[poisson.index("--request-rate") + 1] == "2"
    assert "--timed-trace-sec-multiplier" not in poisson and poisson[-3:] == ["--goodput", "ttft:500", "tpot:50"]
    timed = bench_argv(8000, "m", tmp_path / "d.jsonl", 12, 2.0, 0, targets, tmp_path / "o.json", 0.25)
    assert timed[timed.index("--dataset-name") + 1] == "timed_trace" and "--request-rate" not in timed
    assert timed[timed.index("--timed-trace-sec-multiplier") + 1] == "0.25" and "--ignore-eos" in timed


def test_timed_dataset_keeps_times_prefixes_and_exact_lengths() -> None:
    from qeval.backends.vllm.serve_data import TIMED_CHUNK, timed_dataset
    from qeval.errors import UserError
    from qeval.workload.trace import Request, Trace

    reqs = [
        Request(40, 10, 10.5, "prefix:a", 32),
        Request(20, 5, 11.0),
        Request(50, 5, 12.5, "prefix:a", 32),
        Request(900, 5, 13.0),
    ]  # the last is longer than max-model-len: refused, its time not replayed
    lines, rate = timed_dataset(Trace(reqs, "t", "qeval"), 5, 128)
    assert [x["timestamp"] for x in lines] == [0.0, 0.5, 2.0, 3.0, 3.5]  # from the first; the 2nd pass after a gap
    assert [x["input_length"] for x in lines] == [40, 20, 50, 40, 20]
    assert all(len(x["hash_ids"]) == -(-x["input_length"] // TIMED_CHUNK) for x in lines)
    assert lines[0]["hash_ids"][:2] == lines[2]["hash_ids"][:2] == lines[3]["hash_ids"][:2]  # the shared prefix
    assert not set(lines[0]["hash_ids"][2:]) & set(lines[2]["hash_ids"][2:] + lines[1]["hash_ids"])
    assert rate == pytest.approx(4 / 3.5)
    with pytest.raises(UserError, match="no arrival times"):
        timed_dataset(Trace([Request(40, 10)], "t", "qeval"), 2, 128)
    # issue 54: times that are all the same have no span to scale, and gave every rate the same burst
    with pytest.raises(UserError, match="every request of the workload arrives at 5 s, so every rate"):
        timed_dataset(Trace([Request(40, 10, 5.0), Request(20, 5, 5.0)], "t", "qeval"), 2, 128)
    assert timed_dataset(Trace([Request(40, 10, 5.0)], "t", "qeval"), 2, 128)[1] == 1.0  # one request: a pass a second


def test_each_turn_of_a_conversation_gets_its_own_shared_prefix() -> None:
    """Issue 54 point 11: later turns reused the first turn's prefix text, so a later turn with a
    shorter prompt than that prefix was refused ("cannot write a prompt of exactly 30 tokens")
    and a later turn with a longer prefix shared only the first turn's. Each request now starts
    with exactly its own prefix_tokens of its group's shared tokens."""
    from transformers import AutoTokenizer

    from qeval.backends.vllm.serve_data import dataset
    from qeval.workload.trace import Request, Trace

    tok = AutoTokenizer.from_pretrained(str(ROOT / "models" / "smollm2-135m"))
    reqs = [
        Request(50, 4, None, "conversation:c", 40),
        Request(30, 4, None, "conversation:c", 20),  # a turn shorter than the first turn's prefix
        Request(80, 4, None, "conversation:c", 60),
        Request(100, 4, None, "conversation:c", 90),
        Request(30, 4, None, "conversation:d", 10),
        Request(80, 4, None, "conversation:d", 60),  # a longer later prefix
        Request(90, 4, None, "conversation:d", 60),
        Request(25, 4),
        Request(40, 4, None, "prefix:p", 16),
        Request(60, 4, None, "prefix:p", 16),
    ]
    lines, refused = dataset(Trace(reqs, "t", "qeval"), tok, len(reqs), 4096, 0)
    ids = [tok(line["prompt"]).input_ids for line in lines]
    assert refused == 0 and [len(x) for x in ids] == [r.input_tokens for r in reqs]
    for a, ra in enumerate(reqs):
        for b, rb in enumerate(reqs[:a]):
            if ra.group is not None and ra.group == rb.group:
                shared = min(ra.prefix_tokens, rb.prefix_tokens)
                assert ids[a][:shared] == ids[b][:shared], (a, b, shared)
    assert ids[5][60:] != ids[6][60:]  # beyond their prefix, turns are their own


def test_a_trace_workload_config_round_trips_through_the_job_file() -> None:
    """The worker validates the config from its job file (a whole dump): a trace workload's
    drawn-only keys, present there at their defaults, are not refused (a run failed on it)."""
    base = yaml.safe_load((ROOT / "configs" / "smollm2-goodput.yaml").read_text())
    base["model"]["path"] = str(ROOT / "models" / "smollm2-135m")
    base["workload"]["trace"] = str(ROOT / "configs" / "workloads" / "gsm8k.jsonl")
    cfg = RunConfig.model_validate(base)
    assert RunConfig.model_validate(cfg.job_json()).workload == cfg.workload
    with pytest.raises(ValueError, match="requests applies to a described distribution only"):
        RunConfig.model_validate(base | {"workload": base["workload"] | {"requests": 5}})


def _keyed_config(tmp_path: Path) -> tuple[RunConfig, Path]:
    """A goodput config on qeval-tiny with a trace of its own in tmp_path."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"input_tokens": 20 + i, "output_tokens": 8}) + "\n" for i in range(4)))
    cfg = RunConfig.model_validate(
        {
            "name": "gp",
            "model": {"path": str(ROOT / "models" / "qeval-tiny"), "dtype": "auto", "max_context": 256},
            "backend": "openai",
            "server": {"mode": "launch"},
            "device": "cpu",
            "setups": [{"name": "base", "baseline": True}],
            "tasks": ["addition"],
            "workload": {"trace": str(trace), "slo": {"percentile": 99, "ttft_ms": 4000}},
            "serving": {"rates": [1], "max_num_seqs": [4], "requests": 3},
        }
    )
    return cfg, trace


@pytest.fixture
def fake_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """goodput_run with no engine: each setup's measurement counted, vLLM's version settable."""
    from qeval.backends.vllm.serve import VllmServing
    from qeval.perf import serving as SV

    state: dict[str, Any] = {"served": 0, "vllm": "0.32.0"}

    def serve(run: Any, setup: Any, work: Path, key: str, load: Any) -> ServingSetup:
        state["served"] += 1
        state["requests"] = [r.input_tokens for r in run.trace.requests]
        row = _row(setup.name, 1.0)
        return row.model_copy(update={"key": key})

    class Bench:
        def __init__(self, *a: Any) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(SV, "serve_setup", serve)
    monkeypatch.setattr(VllmServing, "start_load", lambda self, cfg, log: Bench())
    monkeypatch.setattr(VllmServing, "version", lambda self, cfg: state["vllm"])
    monkeypatch.setenv("QEVAL_VLLM_PYTHON", _interpreter(tmp_path, True))  # the install check passes
    return state


def test_goodput_rows_are_keyed_by_content_not_the_traces_path(
    tmp_path: Path, fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 3: a trace rewritten in place, another model checksum, a checkpoint's
    checksum, another vLLM, or force: the stored row is measured again; nothing changed: reused.
    The same bytes under another path are the same workload."""
    import qeval.backends.vllm.support as vllm_support
    from qeval.perf.serving import goodput_run

    # the FP8 KV setup below is a change of key, on any CPU (an AVX2 one refuses it to serve)
    monkeypatch.setattr(vllm_support, "cpu_has_fp8", lambda: True)

    cfg, trace = _keyed_config(tmp_path)
    out = tmp_path / "out"

    def served(**kw: Any) -> int:
        before = fake_engine["served"]
        goodput_run(cfg, out, None, say=lambda _: None, **({"model_sha256": "m1"} | kw))
        return fake_engine["served"] - before

    assert served() == 1
    assert served() == 0  # unchanged: reused
    trace.write_text(trace.read_text().replace('"input_tokens": 2', '"input_tokens": 10'))  # 5x longer, same path
    assert served() == 1 and fake_engine["requests"] == [100, 101, 102, 103]
    assert served() == 0
    assert served(model_sha256="m2") == 1  # the model's content changed
    assert served(model_sha256="m2", checkpoint_sha256={"base": "c1"}) == 1
    fake_engine["vllm"] = "0.33.0"
    assert served(model_sha256="m2", checkpoint_sha256={"base": "c1"}) == 1  # another vLLM
    assert served(model_sha256="m2", checkpoint_sha256={"base": "c1"}) == 0
    assert served(model_sha256="m2", checkpoint_sha256={"base": "c1"}, force=True) == 1  # --force: never reused
    moved = tmp_path / "elsewhere.jsonl"
    moved.write_bytes(trace.read_bytes())
    assert cfg.workload is not None
    cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"trace": str(moved)})})
    assert served(model_sha256="m2", checkpoint_sha256={"base": "c1"}) == 0  # the same bytes elsewhere
    assert cfg.serving is not None and cfg.workload is not None and cfg.workload.slo is not None
    for change in (
        {"serving": cfg.serving.model_copy(update={"requests": 4})},
        {"workload": cfg.workload.model_copy(update={"slo": cfg.workload.slo.model_copy(update={"ttft_ms": 3000})})},
        {"setups": [cfg.setups[0].model_copy(update={"kv_cache": "fp8"})]},
    ):
        cfg = cfg.model_copy(update=change)
        assert served(model_sha256="m2", checkpoint_sha256={"base": "c1"}) == 1, change
    stored = json.loads((out / "serving.json").read_text())
    assert stored["load_generator"].count("0.33.0") == 1


def test_a_model_without_a_tokenizer_and_a_trace_rewritten_while_read_are_bad_input(
    tmp_path: Path, fake_engine: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model folder with no tokenizer is one line (UserError: exit 2), not an OSError read as
    "cannot write the serving files"; a trace rewritten while it is read is refused, not measured
    under the new bytes' key with the old bytes' figures."""
    import shutil

    from qeval.errors import UserError
    from qeval.perf import serving as SV

    cfg, trace = _keyed_config(tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(ROOT / "models" / "qeval-tiny" / "config.json", bare / "config.json")
    no_tok = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(bare)})})
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        SV.goodput_run(no_tok, tmp_path / "a", None, say=lambda _: None, model_sha256="m")
    import qeval.workload.draw as draw

    real = draw.requests_of

    def rewritten(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        trace.write_text(trace.read_text().replace('"output_tokens": 8', '"output_tokens": 9'))
        return out

    monkeypatch.setattr(draw, "requests_of", rewritten)
    with pytest.raises(UserError, match="changed while it was read"):
        SV.goodput_run(cfg, tmp_path / "b", None, say=lambda _: None, model_sha256="m")
    assert fake_engine["served"] == 0


def test_run_force_measures_the_serving_phase_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`qeval run --force` with recommend_by goodput: the serving phase gets force and the run's
    model and checkpoint checksums (the scores' keys)."""
    from types import SimpleNamespace

    from qeval.run import serving as phase

    seen: dict[str, Any] = {}

    def fake(cfg: Any, out: Path, gated: Any, say: Any, **kw: Any) -> ServingResults:
        seen.update(kw)
        raise RuntimeError("stop")

    monkeypatch.setattr(phase, "goodput_run", fake)
    setups = [SimpleNamespace(name="base")]
    pre = SimpleNamespace(
        cfg=SimpleNamespace(setups=setups, model_copy=lambda update: SimpleNamespace(**update)),
        model_sha256="m",
        checkpoint_sha256={"base": "c"},
    )
    results = SimpleNamespace(
        setups=[SimpleNamespace(name="base", status="ok", control=False)],
        recommendation=SimpleNamespace(candidates=["base"], reasons={}),
    )
    with pytest.raises(RuntimeError, match="stop"):
        phase.serve_workload(pre, results, tmp_path, force=True)  # type: ignore[arg-type]
    assert seen == {"model_sha256": "m", "checkpoint_sha256": {"base": "c"}, "force": True}
    import inspect

    from qeval.run.phases import serving as serving_phase

    assert "force=p.opts.force" in inspect.getsource(serving_phase._finish)


def _cli_config(tmp_path: Path) -> Path:
    """A goodput config on qeval-tiny (openai, launched vLLM) for the command line's checks."""
    cfg, _ = _keyed_config(tmp_path)
    path = tmp_path / "gp.yaml"
    body = cfg.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump({k: v for k, v in body.items() if k in _KEYS}))
    return path


_KEYS = ("name", "model", "backend", "server", "device", "setups", "tasks", "workload", "serving")


def _interpreter(tmp_path: Path, has_vllm: bool) -> str:
    """A stand-in for vLLM's interpreter: answers the install check (find_spec) as told."""
    fake = tmp_path / ("py-vllm" if has_vllm else "py-none")
    fake.write_text(f"#!/bin/sh\necho {has_vllm}\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.fixture
def goodput_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`qeval goodput` in process, its serving replaced by the rows `state["rows"]` (None: not
    called expected); what it was given kept in `state`."""
    from qeval.perf import serving as SV

    state: dict[str, Any] = {"calls": []}

    def fake(cfg: Any, out: Path, gated: Any, say: Any = print, **kw: Any) -> ServingResults:
        state["calls"].append({"gated": gated} | kw)
        rows = state["rows"]
        res = ServingResults(
            config=cfg.name,
            workload={"source": "t.jsonl", "slo": {"percentile": 99, "ttft_ms": 500}},
            load_generator="vllm bench serve",
            machine="cpu",
            kv_usage_limit=0.9,
            setups=rows,
            recommendation=recommend_goodput(rows, gated, SloSpec(ttft_ms=500)),
        )
        return res

    monkeypatch.setattr(SV, "goodput_run", fake)
    monkeypatch.setenv("QEVAL_VLLM_PYTHON", _interpreter(tmp_path, True))
    return state


def _goodput(*args: str) -> Any:
    from typer.testing import CliRunner

    from qeval.cli import app

    return CliRunner().invoke(app, ["goodput", *args])


def _failed(name: str) -> ServingSetup:
    return _row(name, None).model_copy(update={"status": "failed", "error": "RuntimeError: boom", "levels": []})


def test_goodput_exit_codes(tmp_path: Path, goodput_cli: dict[str, Any]) -> None:
    """Issue 54 item 6: 0 a setup recommended; 1 one could not be served; 3 none meets the SLO or
    none was served, each said in one line on stderr."""
    path, out = _cli_config(tmp_path), str(tmp_path / "out")
    for rows, code, says in (
        ([_row("base", 1.0)], 0, None),
        ([_row("base", 1.0), _failed("b")], 1, "setups that could not be served: b"),
        ([_row("base", None)], 3, "no setup meets the SLO"),
        ([_failed("base")], 3, "no setup could be served"),
    ):
        goodput_cli["rows"] = rows
        res = _goodput(str(path), "--output", out)
        assert res.exit_code == code, (rows, res.output)
        assert says is None or says in res.stderr.strip().splitlines()[-1], res.stderr
        assert "Traceback" not in res.output


def test_goodput_checks_vllm_before_anything_starts(
    tmp_path: Path, goodput_cli: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 54 item 6: no vLLM where the servers would run: one line, exit 2, nothing written."""
    monkeypatch.setenv("QEVAL_VLLM_PYTHON", _interpreter(tmp_path, False))
    res = _goodput(str(_cli_config(tmp_path)), "--output", str(tmp_path / "out"))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert "vLLM is not installed for" in res.stderr and "py-none" in res.stderr
    assert goodput_cli["calls"] == [] and not (tmp_path / "out").exists()


def test_goodput_output_is_checked_before_anything_loads(
    tmp_path: Path, goodput_cli: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--output` onto a file or where nothing can be created: one line, exit 2, before the
    model is looked at (it was a traceback after the loading)."""
    import qeval.model.source

    def no_load(*a: Any, **k: Any) -> None:
        raise AssertionError("the model was loaded before --output was checked")

    monkeypatch.setattr(qeval.model.source, "resolve_model", no_load)
    path = _cli_config(tmp_path)
    (tmp_path / "file").write_text("x")
    for out, says in ((tmp_path / "file", "exists and is not a directory"), (Path("/proc/x"), "cannot create it")):
        res = _goodput(str(path), "--output", str(out))
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
        assert says in res.stderr and "Traceback" not in res.output
    assert goodput_cli["calls"] == []


def _scored_run(tmp_path: Path, path: Path, out: Path, model_sha256: str | None = None) -> None:
    """run-v1's results.json in `out`, made a run of config `path` on qeval-tiny (its checksum
    unless `model_sha256`), with the run directory's marker."""
    from qeval.backends.device import dtype_for
    from qeval.config import load_config
    from qeval.model.source import resolve_model

    cfg = load_config(path)
    asked = cfg.for_engine(dtype_for(cfg.model.dtype, Path(cfg.model.path), "cpu"))
    data = json.loads((ROOT / "tests" / "data" / "run-v1" / "results.json").read_text())
    data["config"] = asked.as_json()
    data["run"]["name"] = cfg.name
    data["run"]["model_sha256"] = model_sha256 or resolve_model(cfg.model.path).checksum
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps(data))
    (out / ".qeval-run.json").write_text(json.dumps({"config_name": cfg.name}))


def test_goodput_takes_quality_evidence_only_from_a_run_of_its_config_and_model(
    tmp_path: Path, goodput_cli: dict[str, Any]
) -> None:
    """Issue 54 item 5: results.json of another config (run-v1: another name, backend and tasks)
    or of another model is not quality evidence: the gates are not checked, and every reason says
    so; a run of this config on this model is. Another config's run directory is refused unless
    --force, as `qeval run` refuses it."""
    import shutil

    path = _cli_config(tmp_path)
    goodput_cli["rows"] = [_row("base", 1.0)]
    other = tmp_path / "other"
    shutil.copytree(ROOT / "tests" / "data" / "run-v1", other)
    (other / ".qeval-run.json").write_text(json.dumps({"config_name": "demo"}))
    res = _goodput(str(path), "--output", str(other))
    assert res.exit_code == 2 and "holds the run of config 'demo'" in res.stderr and goodput_cli["calls"] == []
    res = _goodput(str(path), "--output", str(other), "--force")
    assert res.exit_code == 0, res.output
    assert goodput_cli["calls"][-1]["gated"] is None and "not used as quality evidence" in res.stderr
    assert "quality gates not checked" in res.stdout
    mine = tmp_path / "mine"
    _scored_run(tmp_path, path, mine, model_sha256="0" * 64)
    res = _goodput(str(path), "--output", str(mine))
    assert res.exit_code == 0 and goodput_cli["calls"][-1]["gated"] is None and "another model" in res.stderr
    _scored_run(tmp_path, path, mine)
    res = _goodput(str(path), "--output", str(mine))
    gated = goodput_cli["calls"][-1]["gated"]
    assert gated is not None and "not used" not in res.stderr, res.output
    assert "base" not in gated[0]  # run-v1's candidates: the setups it scored that pass every gate
    assert res.exit_code == 3 and "no setup meets the SLO and passes every gate" in res.stderr


def test_goodput_holds_the_run_directorys_lock(tmp_path: Path, goodput_cli: dict[str, Any]) -> None:
    """Issue 54 item 5: a `qeval run` writing into RUN_DIR (its lock held) refuses goodput there."""
    from qeval.run.rundir import take_run_dir

    path = _cli_config(tmp_path)
    goodput_cli["rows"] = [_row("base", 1.0)]
    held = take_run_dir(tmp_path / "out", "gp", False)
    try:
        res = _goodput(str(path), "--output", str(tmp_path / "out"))
        assert res.exit_code == 2 and "another qeval run" in res.stderr and goodput_cli["calls"] == []
    finally:
        held.release()
    assert _goodput(str(path), "--output", str(tmp_path / "out")).exit_code == 0


def test_plan_workload_points_at_the_goodput_measurement(tmp_path: Path) -> None:
    """`qeval plan --workload` with an slo: says where the load is measured against it (`qeval
    goodput`), not that the measurement "is not built yet"; its targets keep their digits."""
    from typer.testing import CliRunner

    from qeval.cli import app

    cfg, _ = _keyed_config(tmp_path)
    body = cfg.model_dump(mode="json", exclude_none=True)
    body["workload"]["slo"] = {"percentile": 99, "ttft_ms": 0.5, "tpot_ms": 50}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in body.items() if k in _KEYS}))
    res = CliRunner().invoke(app, ["plan", "--workload", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "not built yet" not in text and "`qeval goodput` serves this workload" in text, text
    assert "ttft 0.5 ms" in text


def test_goodput_cannot_write_its_files_is_one_line_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qeval.perf import serving as SV

    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device", "serving.json")

    monkeypatch.setattr(SV, "goodput_run", full)
    monkeypatch.setenv("QEVAL_VLLM_PYTHON", _interpreter(tmp_path, True))
    res = _goodput(str(_cli_config(tmp_path)), "--output", str(tmp_path / "out"))
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert "cannot write the serving files (serving.json): No space left on device" in res.stderr


def test_a_goodput_difference_the_count_cannot_resolve_is_a_tie_broken_by_quality_then_memory() -> None:
    """0.828 against 0.826 requests/s (the serving phase's bf16 against an FP8 KV cache, one run of
    each level): about 83 requests within the SLO in 100 s each, a Poisson spread of about ±0.18
    requests/s. The two are tied; the tie rule decides, and the reasons say so."""
    slo = SloSpec(ttft_ms=500)

    def row(name: str, goodput: float) -> ServingSetup:
        r = _row(name, goodput)
        return r.model_copy(update={"levels": [r.levels[0].model_copy(update={"duration_s": 100.0, "requests": 100})]})

    rows = [row("bf16", 0.828), row("kv-fp8", 0.826), row("int4", 0.2)]
    lo, hi = goodput_interval(rows[0])
    assert lo < 0.826 < hi and hi - lo > 0.3
    quality = {"bf16": (0.0, -60), "kv-fp8": (0.0, -120), "int4": (0.01, -200)}  # same drop: memory decides
    rec = recommend_goodput(rows, (["bf16", "kv-fp8", "int4"], {}), slo, quality.__getitem__)
    assert rec.setup == "kv-fp8"
    assert "tied with bf16's" in rec.reasons["kv-fp8"] and "broken by quality" in rec.reasons["kv-fp8"]
    assert "tied with kv-fp8 within the measurement's spread" in rec.reasons["bf16"]
    assert "tied" not in rec.reasons["int4"]  # 0.2 is resolved: not within the spread
    # without a tie rule (no scored run to judge quality on) the higher figure stands, said to be no clear win
    plain = recommend_goodput(rows, None, slo)
    assert plain.setup == "bf16" and "not a clear win" in plain.reasons["bf16"]
