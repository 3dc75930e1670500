"""The performance phase (qeval/perf, docs/performance.md): invariants of its figures, not
their values (timings belong to bench/, not tests). The transformers measurement runs for
real on the shipped tiny model; the end-to-end demo and vLLM checks are in tests/e2e and
tests/backends (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qeval.analysis.recommend import recommend, worst_drop
from qeval.backends.workload import Measurement, Wave, resolve_levels, workload_for
from qeval.config import ModelSpec, RunConfig
from qeval.config.performance import PerfSpec
from qeval.config.setups import Setup
from qeval.memory.ledger import ModelShape
from qeval.perf.block import performance_block
from qeval.perf.phase import summarize
from qeval.perf.stats import measured
from qeval.records.job import PhaseRecord
from qeval.report.performance import pareto3
from qeval.results.performance import Ceilings, Performance
from qeval.results.schema import Results, read_results
from tests.helpers import MODEL, PERF_FIGURES, ROOT, assert_figures_carry_their_source, cpu_dtype, run_cli

V1 = ROOT / "tests" / "data" / "run-v1"
# -- the workload ---------------------------------------------------------------------------------


def test_levels_come_from_the_budget_capped_and_said_so() -> None:
    spec = PerfSpec(max_concurrency=32)
    assert resolve_levels(spec, 25.18, None) == ([1, 25], "max: the budget allows 25.18 sequences")
    levels, why = resolve_levels(spec, 80.6, None)
    assert levels == [1, 32] and "capped at performance.max_concurrency = 32" in why
    levels, why = resolve_levels(spec, 80.6, 16)
    assert levels == [1, 16] and "max_num_seqs = 16" in why
    levels, why = resolve_levels(spec, 0.4, None)  # less than one sequence fits: 1 is still timed
    assert levels == [1] and "less than one" in why
    assert resolve_levels(PerfSpec(concurrency=[4, 2]), 10, None) == ([2, 4], "as configured")
    with pytest.raises(ValueError, match="max_num_seqs"):
        resolve_levels(PerfSpec(concurrency=[1, 300]), 10, 256)


def test_waves_and_order() -> None:
    wl = workload_for(PerfSpec(num_requests=10), [1, 4, 32], "", 0)
    assert [wl.requests_at(c) for c in (1, 4, 32)] == [10, 12, 32]  # whole waves, at least one
    assert wl.order(0) == [1, 4, 32] and wl.order(1) == [32, 4, 1]  # ABBA: drift favours no level


def test_summary_is_median_and_range_over_repeats() -> None:
    wl = workload_for(PerfSpec(repeats=3, num_requests=2), [1, 2], "", 0)

    def wave(c: int, scale: float) -> Wave:
        return Wave(
            elapsed_s=scale * 1.0,
            prompt_tokens=c * 10,
            output_tokens=c * 5,
            prefill_s=scale * 0.1,
            decode_tokens_per_s=c * 4 / (scale * 0.9),
            ttft_s=[scale * 0.1] * c,
            tpot_s=[scale * 0.225] * c,
            e2e_s=[scale * 1.0] * c,
        )

    m = Measurement(
        {1: [[wave(1, s), wave(1, s)] for s in (1.0, 2.0, 4.0)], 2: [[wave(2, s)] for s in (1, 2, 4)]},
        {
            k: "how"
            for k in (
                "requests_per_s",
                "output_tokens_per_s",
                "prefill_tokens_per_s",
                "decode_tokens_per_s",
                "ttft",
                "tpot",
                "e2e",
            )
        },
    )
    levels = summarize(m, wl)
    assert_figures_carry_their_source({"levels": [x.model_dump() for x in levels]})
    one = levels[0].figures
    assert one["requests_per_s"].values == [1.0, 0.5, 0.25] and one["requests_per_s"].median == 0.5
    assert one["output_tokens_per_s"].median == 2.5 and levels[1].figures["requests_per_s"].median == 1.0
    assert measured([3.0, 1.0, 2.0], "s", "x")["median"] == 2.0


# -- ceilings and shares --------------------------------------------------------------------------


def _stored(decode: float, prefill: float) -> PhaseRecord:
    def fig(v: float, unit: str) -> dict[str, Any]:
        return measured([v, v], unit, "how [workload: x]")

    levels = []
    for c in (1, 8):
        figures = {n: fig(0.01, "s") for n in PERF_FIGURES}
        figures |= {
            "requests_per_s": fig(c * 2.0, "requests/s"),
            "output_tokens_per_s": fig(c * 30.0, "tokens/s"),
            "prefill_tokens_per_s": fig(prefill, "tokens/s"),
            "decode_tokens_per_s": fig(decode, "tokens/s"),
        }
        levels.append({"concurrency": c, "requests": c, "figures": figures})
    return PhaseRecord.model_validate(
        {
            "key": "k",
            "status": "ok",
            "levels": levels,
            "notes": [],
            "workload": workload_for(PerfSpec(), [1, 8], "", 0).as_dict(),
        }
    )


def _ceilings() -> Ceilings:
    return Ceilings(
        device="cpu",
        device_name="test",
        threads=2,
        torch="x",
        cache_bytes=1,
        copy_bandwidth=measured([1e10], "bytes/s", "copy"),
        matmul_peak={"bfloat16": measured([1e11], "FLOP/s", "mm"), "int8": measured([2e11], "OP/s", "i8")},
    )


def test_shares_of_the_ceiling_and_a_share_over_one_is_flagged() -> None:
    setup = Setup(name="bf16")
    shape = ModelShape.from_model_dir(MODEL)
    results = read_results(V1 / "results.json")
    memory = results.setup("bf16").memory
    perf, flags = performance_block(
        setup, _stored(decode=50, prefill=1000), "k", memory, shape, "bfloat16", _ceilings()
    )
    assert perf is not None and perf.decode is not None and perf.prefill is not None and not flags
    assert 0 < perf.decode.share <= 1 and 0 < perf.prefill.share <= 1
    assert perf.decode.concurrency == 1 and perf.prefill.concurrency == 8
    assert "copy bandwidth" in perf.decode.source and "matmul peak" in perf.prefill.source
    # a share over 1 is kept as measured and flagged: the ceiling, not the setup, is wrong
    perf, flags = performance_block(
        setup, _stored(decode=1e9, prefill=1000), "k", memory, shape, "bfloat16", _ceilings()
    )
    assert perf is not None and perf.decode is not None and perf.decode.share > 1
    assert len(flags) == 1 and flags[0].startswith("ceiling_exceeded: decode")
    # W8A8 runs int8 matmuls: its prefill is measured against the int8 peak
    w8a8 = Setup(name="w8a8", weights="int8", method="w8a8")
    perf, _ = performance_block(w8a8, _stored(decode=50, prefill=1000), "k", memory, shape, "bfloat16", _ceilings())
    assert perf is not None and perf.prefill is not None and perf.prefill.source.startswith("int8")
    # stored under another key: not shown, and said so
    perf, flags = performance_block(setup, _stored(50, 1000), "other", memory, shape, "bfloat16", _ceilings())
    assert perf is None and flags[0].startswith("performance_not_current")


def test_pareto_front_over_three_sides() -> None:
    pts = [("a", 0.0, 100, 10.0), ("b", -1.0, 50, 10.0), ("c", -1.0, 60, 9.0), ("d", 0.0, 100, 20.0)]
    assert pareto3(pts) == {"b", "d"}  # a: d is as good and faster; c: b is smaller and faster


# -- the recommendation ---------------------------------------------------------------------------


def _with_perf(results: Results, tps: dict[str, float], latency: dict[str, float], by: str) -> Results:
    setups = []
    for s in results.setups:
        stored = _stored(50, 1000).model_dump()
        for level in stored["levels"]:
            level["figures"]["output_tokens_per_s"] = measured([tps[s.name]] * 3, "tokens/s", "how")
            level["figures"]["e2e_p50_s"] = measured([latency[s.name]] * 3, "s", "how")
        setups.append(
            s.model_copy(
                update={
                    "performance": Performance.model_validate(
                        {
                            **stored,
                            "levels": [
                                {"concurrency": x["concurrency"], "requests": x["requests"], **x["figures"]}
                                for x in stored["levels"]
                            ],
                        }
                    )
                }
            )
        )
    return results.model_copy(
        update={"setups": setups, "config": results.config.model_copy(update={"recommend_by": by})}
    )


def test_recommend_by_throughput_or_latency_stays_subject_to_the_gates() -> None:
    results = read_results(V1 / "results.json")  # candidates: int4, int8, bf16; kv-int4 inconclusive
    names = [s.name for s in results.setups]
    tps = dict(zip(names, [100.0, 300.0, 200.0, 900.0, 950.0], strict=True))
    lat = dict(zip(names, [0.5, 0.3, 0.4, 0.1, 0.05], strict=True))
    rec = recommend(_with_perf(results, tps, lat, "throughput"))
    assert rec.setup == "int8"  # kv-int4 and kv-int2 are faster but do not pass every gate
    assert rec.reasons["int8"].startswith("int8: recommended (by throughput)")
    assert "300 output tokens/s" in rec.reasons["int8"] and "against 300" in rec.reasons["int4"]
    assert rec.reasons["kv-int2"].endswith("fails the 2 pt gate")
    rec = recommend(_with_perf(results, tps, lat, "latency"))
    assert rec.setup == "int8" and "300.0 ms" in rec.reasons["int8"]
    assert recommend(results).setup == "int4"  # concurrency, today's rule, by default


# -- the transformers measurement, for real -------------------------------------------------------


def test_hf_performance_on_the_tiny_model() -> None:
    """Throughput rises from concurrency 1 to a batch of 8, and every figure carries its
    source and repeat count."""
    from qeval.backends.hf.backend import HFBackend

    setup = Setup(name="bf16")
    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(MODEL), dtype=cpu_dtype(), max_context=256),
        setups=[setup],
        tasks=["x"],
        performance=PerfSpec(input_len=32, output_len=8, num_requests=8, repeats=2),
    )
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    wl = workload_for(cfg.performance, [1, 8], "", 0)
    levels = summarize(b.performance(wl), wl)
    assert_figures_carry_their_source({"levels": [x.model_dump() for x in levels]})
    one, eight = (x.figures for x in levels)
    assert eight["output_tokens_per_s"].median > one["output_tokens_per_s"].median
    assert eight["decode_tokens_per_s"].median > one["decode_tokens_per_s"].median


def test_hf_waves_follow_the_workloads_lengths(tmp_path: Path) -> None:
    """performance.from_workload: each request's prompt and output lengths from the config's
    workload (a trace, in order, cycled); a wave is one padded batch, each request done at its own
    last token; the figures say where the lengths came from; the key changes only when asked."""
    from qeval.backends.hf.backend import HFBackend
    from qeval.config.workload import WorkloadSpec
    from qeval.perf.phase import perf_key, workload_lengths

    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"input_tokens": i, "output_tokens": o}) + "\n" for i, o in ((12, 2), (30, 9), (20, 1), (8, 5))
        )
    )
    setup = Setup(name="bf16")
    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(MODEL), dtype=cpu_dtype(), max_context=256),
        setups=[setup],
        tasks=["x"],
        workload=WorkloadSpec(trace=str(trace)),
        performance=PerfSpec(num_requests=4, repeats=1, warmup=0, from_workload=True),
    )
    lengths, source = workload_lengths(cfg)
    assert lengths == ((12, 2), (30, 9), (20, 2), (8, 5)) and "t.jsonl" in source  # one output token: timed as 2
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    wl = workload_for(cfg.performance, [1, 2], "", 0, lengths, source)
    m = b.performance(wl)
    assert "request lengths from the workload" in m.notes[0]
    solo = m.waves[1][0]
    assert [w.prompt_tokens for w in solo] == [12, 30, 20, 8] and [w.output_tokens for w in solo] == [2, 9, 2, 5]
    pair = m.waves[2][0]
    assert [w.prompt_tokens for w in pair] == [42, 28] and [w.output_tokens for w in pair] == [11, 7]
    # in a batch, the shorter answer is done first: its latency ends at its own last token
    assert pair[0].e2e_s[0] < pair[0].e2e_s[1] <= pair[0].elapsed_s
    levels = summarize(m, wl)
    assert WORKLOAD_MARK_TEXT in levels[0].figures["e2e_p50_s"].source
    plain = cfg.model_copy(update={"performance": cfg.performance.model_copy(update={"from_workload": False})})
    assert perf_key({"m": "x"}, plain) != perf_key({"m": "x"}, cfg)
    assert "from_workload" not in plain.as_json()["performance"]
    with pytest.raises(ValueError, match="from_workload needs a workload"):
        RunConfig(
            name="t",
            model=ModelSpec(path=str(MODEL)),
            setups=[setup],
            tasks=["x"],
            performance=PerfSpec(from_workload=True),
        )


WORKLOAD_MARK_TEXT = "the lengths of the workload's requests in order"


# -- config and old results -----------------------------------------------------------------------


def test_bad_performance_config_is_one_line(tmp_path: Path) -> None:
    from tests.helpers import make_config

    for keys, message in (
        ({"performance": {"input_len": 250, "output_len": 16}}, "exceeds model.max_context 256"),
        ({"performance": False, "recommend_by": "latency"}, "needs the performance phase"),
        ({"performance": {"concurrency": [1, 0]}}, "at least 1"),
        ({"performance": None, "recommend_by": "speed"}, "recommend_by"),
    ):
        res = run_cli("validate", str(make_config(tmp_path, **keys)))
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert message in res.stderr, res.stderr


def test_results_without_performance_have_no_performance_section() -> None:
    results = read_results(V1 / "results.json")
    assert results.ceilings is None and all(s.performance is None for s in results.setups)
    from qeval.report.markdown import render_markdown

    assert "## Performance" not in render_markdown(results)
    import qeval

    assert qeval.load_run(str(V1)).performance().empty
    assert json.loads((V1 / "results.json").read_text())["schema_version"] == 1


def test_the_phase_is_on_only_where_the_config_asks_or_the_command_line_says(tmp_path: Path) -> None:
    """No `performance:` block: no phase (a quality-only run pays nothing for it); a block, even
    empty, turns it on; `--no-performance` skips it for one run, `--performance` forces it."""
    from qeval.config import load_config
    from qeval.run.options import RunOptions
    from qeval.run.runner import check

    base = (ROOT / "configs" / "demo.yaml").read_text().replace("path: models/qeval-tiny", f"path: {MODEL}")
    without = base.split("performance:")[0]
    for text, enabled in ((without, False), (without + "performance: {}\n", True), (base, True)):
        (tmp_path / "c.yaml").write_text(text)
        cfg = load_config(tmp_path / "c.yaml")
        assert cfg.performance.enabled is enabled
        assert check(cfg, RunOptions(tmp_path / "o", performance=False)).cfg.performance.enabled is False
        assert check(cfg, RunOptions(tmp_path / "o", performance=True)).cfg.performance.enabled is True
    (tmp_path / "c.yaml").write_text(base + "recommend_by: latency\n")
    res = run_cli("run", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "out"), "--no-performance")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--no-performance: recommend_by latency needs the performance phase" in res.stderr
    assert not (tmp_path / "out").exists()  # refused before the run directory was taken


def test_no_ceilings_from_a_driver_whose_jobs_run_on_a_ray_cluster(tmp_path: Path) -> None:
    """The driver's device is not the cluster nodes': the probe is skipped and the reason stored."""
    from qeval.config import load_config
    from qeval.perf.ceilings import ensure_ceilings, read_ceilings
    from qeval.records.store import RunStore
    from qeval.run.executors.address import cluster_address
    from qeval.run.preflight import preflight

    text = (ROOT / "configs" / "demo.yaml").read_text().replace("path: models/qeval-tiny", f"path: {MODEL}")
    (tmp_path / "c.yaml").write_text(text + "executor: {kind: ray, address: '10.0.0.1:6379'}\n")
    pre = preflight(load_config(tmp_path / "c.yaml"), None, None)
    store = RunStore(tmp_path / "run")
    remote = cluster_address(pre.cfg.executor.address)  # as the runner asks before the probe
    assert ensure_ceilings(pre, store, "/nonexistent/python", remote) is None  # no process started
    stored = json.loads((tmp_path / "run" / "ceilings.json").read_text())
    assert "not measured: the jobs run on the Ray cluster at 10.0.0.1:6379" in stored["error"]
    assert read_ceilings(store) is None


def test_a_speed_difference_within_the_repeats_is_a_tie_broken_by_quality_then_memory() -> None:
    """int8 and int4 both pass; int8 is 1% faster, inside the repeats' spread (each figure's three
    repeats overlap the other's): tied, so the smaller worst drop decides, then more sequences."""
    results = read_results(V1 / "results.json")
    names = [s.name for s in results.setups]
    tps = dict(zip(names, [100.0, 303.0, 300.0, 900.0, 950.0], strict=True))
    ranked = _with_perf(results, tps, dict.fromkeys(names, 0.3), "throughput")
    spread = []
    for s in ranked.setups:  # repeats 0.95x / 1x / 1.05x of each figure
        assert s.performance is not None
        level = s.performance.levels[-1]
        vals = [tps[s.name] * f for f in (0.95, 1.0, 1.05)]
        figure = level.output_tokens_per_s.model_copy(update={"values": vals, "min": min(vals), "max": max(vals)})
        level = level.model_copy(update={"output_tokens_per_s": figure})
        perf = s.performance.model_copy(update={"levels": [*s.performance.levels[:-1], level]})
        spread.append(s.model_copy(update={"performance": perf}))
    rec = recommend(ranked.model_copy(update={"setups": spread}))
    by = {s.name: s for s in spread}
    want = min(("int8", "int4"), key=lambda n: (worst_drop(by[n]), -(by[n].memory.max_concurrency or 0)))
    assert rec.setup == want
    other = "int4" if want == "int8" else "int8"
    assert "broken by quality" in rec.reasons[want] and "tied within the measured spread" in rec.reasons[other]
