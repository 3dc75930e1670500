"""`qeval run` under `recommend_by: goodput` (issue 41): after scoring, the serving phase serves the
setups that scored (qeval/perf/serving.py, replaced here by recorded figures: the real engine path
is tests/perf/test_goodput.py's slow test), results.json gets its `serving` block, the
recommendation is decided by goodput among the setups that pass every gate, and report.md and
report.html show the section. The scores are a stored real run (tests/data/run-v1)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qeval.analysis.recommend import recommend
from qeval.config.workload import SloSpec
from qeval.perf.rank import recommend_goodput
from qeval.report.write import write_report
from qeval.results.schema import Results, read_results
from qeval.results.serving import ServingLevel, ServingPick, ServingResults, ServingSetup
from qeval.run.phases import report_sections
from tests.helpers import ROOT

SLO = {"percentile": 99, "ttft_ms": 500}


def _level(goodput: float, p99: float) -> ServingLevel:
    pct = {name: {"p50": p99 / 2, "p90": p99 * 0.9, "p99": p99} for name in ("ttft", "tpot", "itl", "e2e")}
    return ServingLevel(
        max_num_seqs=8,
        rate=1.0,
        requests=12,
        completed=12,
        failed=0,
        duration_s=12.0,
        goodput_rps=goodput,
        throughput_rps=1.0,
        output_tokens_per_s=50.0,
        percentiles_ms=pct,
        meets_slo=p99 <= 500,
        violations=[] if p99 <= 500 else ["ttft"],
        kv_usage_peak=0.4,
        kv_usage_mean=0.2,
        preemptions=0,
        queue_time_mean_ms=1.0,
        kv_samples=9,
    )


def _served(name: str, goodput: float | None) -> ServingSetup:
    pick = ServingPick(max_num_seqs=8, rate=1.0, goodput_rps=goodput) if goodput is not None else None
    return ServingSetup(
        setup=name,
        key="k",
        status="ok",
        max_model_len=512,
        prefix_caching=False,
        levels=[_level(goodput or 0.0, 100.0 if pick else 900.0)],
        pick=pick,
        best_p99_ms={} if pick else {"ttft_ms": 900.0},
        serve_command=f"vllm serve models/{name} --max-num-seqs 8 --max-model-len 512",
    )


def _serving(rows: list[ServingSetup], gated: tuple[list[str], dict[str, str]] | None) -> ServingResults:
    return ServingResults(
        config="run-v1",
        workload={"source": "trace.jsonl", "requests_per_level": 12, "slo": SLO, "arrivals": "Poisson (seed 0)"},
        load_generator="vllm bench serve",
        machine="cpu",
        kv_usage_limit=0.9,
        setups=rows,
        recommendation=recommend_goodput(rows, gated, SloSpec(**SLO)),
    )


def _goodput_run(tmp_path: Path) -> Results:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "run-v1", run)
    results = read_results(run / "results.json")
    config = results.config.model_copy(update={"recommend_by": "goodput"})
    results = results.model_copy(update={"config": config})
    return results.model_copy(update={"recommendation": recommend(results)})


def test_before_serving_every_passing_setup_says_where_goodput_comes_from(tmp_path: Path) -> None:
    results = _goodput_run(tmp_path)
    rec = results.recommendation
    assert rec.setup is None and sorted(rec.candidates) == ["bf16", "int4", "int8"]
    assert "serving phase" in rec.reasons["int8"] and "fails the 2 pt gate" in rec.reasons["kv-int2"]


def test_serving_decides_among_the_gated_setups_and_joins_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qeval.run import serving as phase

    results = _goodput_run(tmp_path)
    seen: dict[str, Any] = {}

    def fake_goodput_run(cfg: Any, out: Path, gated: Any, say: Any, **kw: Any) -> ServingResults:
        seen["setups"], seen["gated"] = [s.name for s in cfg.setups], gated
        # kv-int2 serves the most, but fails its gate; int4 cannot meet the SLO; int8 beats bf16
        rows = [
            _served("bf16", 1.0),
            _served("int8", 1.9),
            _served("int4", None),
            _served("kv-int4", 2.5),
            _served("kv-int2", 5.0),
        ]
        return _serving(rows, gated)

    monkeypatch.setattr(phase, "goodput_run", fake_goodput_run)
    setups = [SimpleNamespace(name=s.name) for s in results.setups]
    pre = SimpleNamespace(
        cfg=SimpleNamespace(setups=setups, model_copy=lambda update: SimpleNamespace(**update)),
        model_sha256="m",
        checkpoint_sha256={},
    )
    out = tmp_path / "run"
    served = phase.serve_workload(pre, results, out)  # type: ignore[arg-type]
    assert seen["setups"] == ["bf16", "int8", "int4", "kv-int4", "kv-int2"]
    assert sorted(seen["gated"][0]) == ["bf16", "int4", "int8"] and "kv-int2" in seen["gated"][1]
    rec = served.recommendation
    assert rec.setup == "int8" and served.serving is not None
    assert "recommended (by goodput)" in rec.reasons["int8"] and "0.53x int8's goodput" in rec.reasons["bf16"]
    assert "cannot meet the SLO" in rec.reasons["int4"]
    assert "fails the 2 pt gate" in rec.reasons["kv-int2"] and "inconclusive" in rec.reasons["kv-int4"]
    assert (out / "serving.md").is_file() and (out / "serving-pareto.svg").is_file()
    # results.json round trip, then the report: the section, the tuned commands, the figures in the html
    (out / "results.json").write_text(served.model_dump_json(indent=2) + "\n")
    again = read_results(out / "results.json")
    assert again.serving == served.serving and recommend(again) == rec
    md, html = write_report(out, again, report_sections())
    text = md.read_text()
    assert "## Serving the workload" in text and "vllm serve models/int8 --max-num-seqs 8" in text
    assert "| int4 | SLO not met (best p99: TTFT 900 ms) |" in text
    page = html.read_text()
    assert "Serving: goodput per setup at its tuned flags" in page and page.count("<svg") >= 6


def test_a_run_without_serving_is_unchanged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "run-v1", run)
    results = read_results(run / "results.json")
    assert results.serving is None
    md, _ = write_report(run, results)
    assert md.read_text() == (ROOT / "tests" / "data" / "run-v1" / "report.md").read_text()


def test_fail_on_gate_needs_the_candidate_to_meet_the_slo(tmp_path: Path) -> None:
    """Issue 54 item 7: under recommend_by goodput, `run --fail-on-gate` stops a candidate that
    passes every gate but meets the SLO at no level; with no candidate, its message says that
    none of the setups passing every gate meets the SLO (not that none passes every gate)."""
    from qeval.analysis.recommend import candidate_problem
    from qeval.run.exits import EXIT_GATE_FAILED, EXIT_OK, exit_code

    results = _goodput_run(tmp_path)
    gated: tuple[list[str], dict[str, str]] = (list(results.recommendation.candidates), {})

    def served(rows: list[ServingSetup], candidate: str | None = None) -> Results:
        config = results.config.model_copy(update={"candidate": candidate} if candidate else {})
        out = results.model_copy(update={"config": config, "serving": _serving(rows, gated)})
        return out.model_copy(update={"recommendation": recommend(out)})

    none_meets = [_served(n, None) for n in ("bf16", "int8", "int4", "kv-int4", "kv-int2")]
    problem = candidate_problem(served(none_meets))
    assert problem is not None and "no setup that passes every gate meets the SLO" in problem, problem
    assert "bf16, int8, int4" in problem
    problem = candidate_problem(served(none_meets, candidate="int8"))
    assert problem == "candidate int8 meets the SLO at no level measured (best p99: TTFT 900.0 ms)"
    assert exit_code(served(none_meets, candidate="int8"), fail_on_gate=True) == EXIT_GATE_FAILED
    meets = [_served("bf16", 1.0), _served("int8", 1.9), _served("int4", None)]
    assert candidate_problem(served(meets, candidate="int8")) is None
    assert exit_code(served(meets), fail_on_gate=True) == EXIT_OK  # int8 recommended
    assert candidate_problem(served(meets[1:], candidate="bf16")) == "candidate bf16 was not served"
    before = results.model_copy(update={"config": results.config.model_copy(update={"candidate": "int8"})})
    assert "serving phase has not run" in (candidate_problem(before) or "")


def test_report_md_writes_the_slo_as_text_and_html_escapes_it(tmp_path: Path) -> None:
    """report.md's serving recommendation reads "TTFT <= 500 ms", not the HTML entity "&lt;=";
    report.html escapes it; markup from the results stays inert in the .md."""
    from qeval.report.tables import md_text

    results = _goodput_run(tmp_path)
    gated: tuple[list[str], dict[str, str]] = (list(results.recommendation.candidates), {})
    out = results.model_copy(update={"serving": _serving([_served("int8", 1.9), _served("bf16", None)], gated)})
    out = out.model_copy(update={"recommendation": recommend(out)})
    (tmp_path / "run" / "results.json").write_text(out.model_dump_json(indent=2) + "\n")
    md, html = write_report(tmp_path / "run", read_results(tmp_path / "run" / "results.json"), report_sections())
    text = md.read_text()
    assert "99th-percentile TTFT <= 500 ms" in text and "&lt;" not in text, text[:3000]
    assert "TTFT &lt;= 500 ms" in html.read_text()
    assert md_text("a <img src=x onerror=y> b") == "a &lt;img src=x onerror=y&gt; b"
    assert md_text("> quote") == "&gt; quote" and md_text("52.5 ms > 0.4 ms") == "52.5 ms > 0.4 ms"
