"""`qeval run` end to end on the shipped model: every setup kind, the ledger, resume,
--force, a setup that runs out of memory, and the results schema (docs/architecture.md §7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qeval.perf.ceilings import REPEATS
from tests.helpers import DEMO_RUN_LIMIT, ROOT, assert_performance_invariants, run_cli

pytestmark = pytest.mark.slow
LIMIT = DEMO_RUN_LIMIT  # the demo_run fixture's (tests/conftest.py)


def _setup(results: dict, name: str) -> dict:
    return next(s for s in results["setups"] if s["name"] == name)


def test_every_setup_ok_and_scored(demo_run: tuple[Path, dict]) -> None:
    out, r = demo_run
    assert r["schema_version"] == 1
    assert {"name", "config_hash", "qeval_version", "git_commit", "finished"} <= set(r["run"])
    for s in r["setups"]:
        assert s["status"] == "ok", s["error"]
        assert set(s["tasks"]) == {"compare_mc", "addition", "facts", "ppl"}
        for task, t in s["tasks"].items():
            assert t["n"] == int(LIMIT)
            for m in t["metrics"].values():
                assert set(m) == {"value", "stderr"}
            lines = (out / "samples" / s["name"] / f"{task}.jsonl").read_text().splitlines()
            rec = json.loads(lines[0])
            assert {"sample_id", "target", "prediction", "correct", "loglikelihoods", "nll", "n_tokens"} <= set(rec)
    assert "quanto" in _setup(r, "int4")["library_versions"]["optimum-quanto"] or _setup(r, "int4")["library_versions"]


def test_memory_ledger_holds(demo_run: tuple[Path, dict]) -> None:
    _, r = demo_run
    w = {s["name"]: s["memory"]["weights_bytes"]["measured"] for s in r["setups"]}
    kv = {s["name"]: s["memory"]["kv_bytes_per_token"]["measured"] for s in r["setups"]}
    assert w["int8"] <= 0.65 * w["bf16"]
    assert w["int4"] <= 0.45 * w["bf16"]
    assert kv["kv-int4"] <= 0.35 * kv["bf16"]
    assert kv["kv-int2"] < kv["kv-int4"]
    for s in r["setups"]:
        mem = s["memory"]
        for fig in ("weights_bytes", "kv_bytes_per_token", "peak_bytes"):
            assert mem[fig]["measured"] and mem[fig]["source"] != "not measured"
        # measured and predicted agree (the prediction is from config.json alone)
        assert mem["weights_bytes"]["measured"] == pytest.approx(mem["weights_bytes"]["predicted"], rel=0.05)
        assert mem["kv_bytes_per_token"]["measured"] == pytest.approx(mem["kv_bytes_per_token"]["predicted"], rel=0.05)
        assert mem["max_concurrency"] > 0


def test_every_quantized_setup_differs_from_baseline(demo_run: tuple[Path, dict]) -> None:
    _, r = demo_run
    for s in r["setups"]:
        if s["baseline"]:
            continue
        ppl = s["vs_baseline"]["ppl"]
        assert ppl["kl"] > 0, s["name"]
        assert 0 < ppl["top1_agreement"] <= 1
        assert not s["flags"], s["flags"]
        for cmp in s["vs_baseline"].values():
            assert cmp["ci"][0] <= cmp["delta"] <= cmp["ci"][1]
            assert cmp["verdict"] in ("pass", "fail", "inconclusive")


def test_report_has_the_table(demo_run: tuple[Path, dict]) -> None:
    out, r = demo_run
    md = (out / "report.md").read_text()
    for s in r["setups"]:
        assert s["name"] in md
    assert "KV bytes/token" in md and "addition exact_match" in md


def test_every_setup_has_a_performance_block(demo_run: tuple[Path, dict]) -> None:
    """The performance phase: the demo times every setup after scoring, at concurrency 1 and the most
    sequences its memory allows (capped by the config), against ceilings measured once."""
    out, r = demo_run
    c = r["ceilings"]
    # repeats: up to REPEATS, as many as fit the probe's time bound (one on a loaded machine)
    assert c["device"] == r["run"]["device"] and 1 <= c["copy_bandwidth"]["repeats"] <= REPEATS
    assert c["copy_bandwidth"]["median"] > 0 and r["config"]["model"]["dtype"] in c["matmul_peak"]
    cap = r["config"]["performance"]["max_concurrency"]
    for s in r["setups"]:
        assert_performance_invariants(s)
        top = s["performance"]["levels"][-1]["concurrency"]
        assert top == min(int(s["memory"]["max_concurrency"]), cap), s["name"]
        assert s["performance"]["budget_concurrency"] == s["memory"]["max_concurrency"]
    md = (out / "report.md").read_text()
    for section in (
        "## Performance",
        "### Quality × memory × throughput",
        "### Throughput",
        "### Latency",
        "### Share of the ceiling",
        "Device ceilings, measured once in this run",
    ):
        assert section in md, section


def test_rerun_resumes_and_force_recomputes(demo_run: tuple[Path, dict]) -> None:
    out, r = demo_run
    sample = out / "samples" / "int8" / "facts.jsonl"
    before = sample.stat().st_mtime_ns
    # an interrupted run: int8's facts result is gone, everything else is stored
    (out / "samples" / "int8" / "facts.meta.json").unlink()
    res = run_cli("run", str(ROOT / "configs" / "demo.yaml"), "--output", str(out), "--limit", LIMIT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("skipped") == len(r["setups"]) - 1
    assert "int8: facts" in res.stderr
    assert sample.stat().st_mtime_ns != before
    untouched = out / "samples" / "int4" / "facts.jsonl"
    t_int4 = untouched.stat().st_mtime_ns
    again = json.loads((out / "results.json").read_text())
    assert _setup(again, "int8")["tasks"] == _setup(r, "int8")["tasks"]  # deterministic recompute
    res = run_cli(
        "run",
        str(ROOT / "configs" / "demo.yaml"),
        "--output",
        str(out),
        "--limit",
        LIMIT,
        "--setups",
        "int4",
        "--tasks",
        "facts",
        "--force",
    )
    assert res.returncode == 0
    assert untouched.stat().st_mtime_ns != t_int4


def test_out_of_memory_setup_is_a_result_and_run_goes_on(tmp_path: Path) -> None:
    cfg = (ROOT / "configs" / "demo.yaml").read_text().split("setups:")[0]
    cfg += """setups:
  - name: bf16
    baseline: true
  - name: tiny-device
    weights: int8
    memory_limit_mib: 1
  - name: kv-int2
    kv_cache: int2
tasks: [addition]
performance: {enabled: false}
"""
    cfg = cfg.replace("path: models/qeval-tiny", f"path: {ROOT / 'models' / 'qeval-tiny'}")
    (tmp_path / "c.yaml").write_text(cfg)
    res = run_cli("run", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "out"), "--limit", "20")
    assert res.returncode == 1, res.stderr[-2000:]  # a setup failed: the run goes on, and says so
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    crashed = _setup(r, "tiny-device")
    assert crashed["status"] == "failed"
    assert "memory_limit_mib=1" in crashed["error"]
    assert _setup(r, "bf16")["status"] == _setup(r, "kv-int2")["status"] == "ok"
    assert "failed: " in (tmp_path / "out" / "report.md").read_text()


def test_recommendation_is_consistent_with_the_gate_table(demo_run: tuple[Path, dict]) -> None:
    _, r = demo_run
    rec = r["recommendation"]
    assert set(rec["reasons"]) == {s["name"] for s in r["setups"]}
    passing = [
        s
        for s in r["setups"]
        if s["status"] == "ok"
        and all(c["verdict"] == "pass" for c in s["vs_baseline"].values())
        and s["memory"]["max_concurrency"] >= 1
    ]
    assert rec["setup"] == max(passing, key=lambda s: s["memory"]["max_concurrency"])["name"]
    for s in r["setups"]:
        verdicts = {c["verdict"] for c in s["vs_baseline"].values()}
        reason = rec["reasons"][s["name"]]
        assert reason.startswith(s["name"] + ":")
        if "fail" in verdicts:
            assert "fails the" in reason
        elif "inconclusive" in verdicts:
            assert "inconclusive" in reason and "samples would decide it" in reason
    assert "fail" in {c["verdict"] for c in _setup(r, "kv-int2")["vs_baseline"].values()}


def test_report_regenerates_byte_for_byte(demo_run: tuple[Path, dict]) -> None:
    out, _ = demo_run
    before = {p: (out / p).read_bytes() for p in ("report.md", "report.html")}
    res = run_cli("report", str(out))
    assert res.returncode == 0, res.stderr
    assert {p: (out / p).read_bytes() for p in before} == before


def test_html_is_self_contained_and_escapes_model_output(demo_run: tuple[Path, dict], tmp_path: Path) -> None:
    import re
    import shutil

    out, r = demo_run
    html = (out / "report.html").read_text()
    assert not re.search(r"https?://|src=|href=\"(?!#)", html)
    for section in ("Recommendation", "Gates", "Performance", "Plots", "Memory ledger", "Provenance", "Sign-off"):
        assert f">{section}<" in html
    run = tmp_path / "run"
    shutil.copytree(out, run)
    path = run / "samples" / "kv-int2" / "addition.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    base = {x["sample_id"]: x["correct"] for x in map(json.loads, (run / "samples" / "bf16" / "addition.jsonl").open())}
    wrong = next(x for x in rows if not x["correct"] and base[x["sample_id"]])  # the first flip: shown
    wrong["prediction"] = "<script>alert(1)</script>"
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert run_cli("report", str(run)).returncode == 0
    html = (run / "report.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, html[html.find("Flipped") :][:3000]
    assert "<script>" not in html


def test_html_renders_its_plots_in_a_headless_browser(demo_run: tuple[Path, dict], tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        assert not os.environ.get("CI"), "CI must install chromium (.ci/run does)"
        pytest.skip("chromium not installed (apt-get install chromium)")
    out, _ = demo_run
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = (out / "report.html").as_uri()
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert dom.count('<figure class="plot">') == 4  # quality/memory, deltas, ledger, quality/memory/throughput
    figures = dom.split('<figure class="plot">')[1:]
    assert all("<svg" in f and f.count("<path") > 10 for f in figures)
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1200,2400", f"--screenshot={shot}", url],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file() and shot.stat().st_size > 50_000  # a rendered page, not a blank one


def test_fail_on_gate(demo_run: tuple[Path, dict], tmp_path: Path) -> None:
    out, r = demo_run
    cfg = ROOT / "configs" / "demo.yaml"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", LIMIT, "--fail-on-gate")
    assert res.returncode == (0 if r["recommendation"]["setup"] else 3), res.stderr[-1000:]
    bad = tmp_path / "c.yaml"
    bad.write_text(
        cfg.read_text().replace("path: models/qeval-tiny", f"path: {ROOT / 'models' / 'qeval-tiny'}")
        + "candidate: kv-int2\n"
    )
    res = run_cli("run", str(bad), "--output", str(out), "--limit", LIMIT, "--fail-on-gate")
    assert res.returncode == 3
    assert "candidate kv-int2 does not pass every gate" in res.stderr


def test_plan_and_the_run_size_the_budget_alike(demo_run: tuple[Path, dict]) -> None:
    """One capacity formula: `qeval plan` on the same model and budget reports the
    same weights, KV bytes and concurrency as the run for the same setup."""
    _, r = demo_run
    b = r["config"]["budget"]
    res = run_cli(
        "plan",
        "--model",
        str(ROOT / "models" / "qeval-tiny"),
        "--json",
        "--gpu-gib",
        str(b["gpu_memory_gib"]),
        "--utilization",
        str(b["utilization"]),
        "--context-len",
        str(b["context_len"]),
        "--overhead-gib",
        str(b["overhead_gib"]),
        "--margin",
        str(b["margin"]),
    )
    assert res.returncode == 0, res.stderr
    plan = {row["setup"]: row for row in json.loads(res.stdout)["setups"]}
    if r["run"]["dtype"] == "float32":  # `dtype: auto` on a CPU without native bf16 (AVX2): the run
        # computed in float32 while `qeval plan` sizes 16-bit weights: the unquantized setup's bytes
        # are exactly twice the plan's (the quantized setups keep float32 parts of their own)
        mem = _setup(r, "bf16")["memory"]
        assert mem["weights_bytes"]["measured"] == 2 * plan["fp16"]["weights_bytes"]
        assert mem["kv_bytes_per_token"]["measured"] == 2 * plan["fp16"]["kv_bytes_per_token"]
        return
    same = {"bf16": "fp16", "int8": "int8", "int4": "int4", "int4-kv-int4": "int4-kv-int4"}
    for run_name, plan_name in same.items():
        mem = _setup(r, run_name)["memory"]
        assert mem["weights_bytes"]["measured"] == plan[plan_name]["weights_bytes"], run_name
        assert mem["kv_bytes_per_token"]["measured"] == plan[plan_name]["kv_bytes_per_token"], run_name
        assert mem["max_concurrency"] == plan[plan_name]["max_concurrency"], run_name
        assert mem["kv_cache_tokens"] == plan[plan_name]["kv_cache_tokens"], run_name


def test_a_run_limited_by_tasks_says_so_everywhere(tmp_path: Path) -> None:
    """`--tasks compare_mc` on the demo: results.json, report.md, report.html and the
    recommendation say the run was judged on part of the config; --fail-on-gate refuses it."""
    out = tmp_path / "out"
    res = run_cli(
        "run",
        str(ROOT / "configs" / "demo.yaml"),
        "--output",
        str(out),
        "--limit",
        "3",
        "--setups",
        "int8",
        "--tasks",
        "compare_mc",
        "--no-performance",
        "--fail-on-gate",
    )
    assert res.returncode == 3, res.stderr[-2000:]
    r = json.loads((out / "results.json").read_text())
    assert r["run"]["partial_tasks"] == {t: "not selected by --tasks" for t in ("addition", "facts", "ppl")}
    assert "judged on part of the config" in r["recommendation"]["reasons"][r["recommendation"]["setup"]]
    cmp = _setup(r, "int8")["vs_baseline"]["compare_mc"]
    assert cmp["verdict"] == "inconclusive" and "only 3 documents paired" in cmp["verdict_reason"]
    assert "This run scored part of the config" in (out / "report.md").read_text()
    assert 'id="partial"' in (out / "report.html").read_text()


def test_the_kl_distribution_is_in_results_report_and_notebook(demo_run: tuple[Path, dict]) -> None:
    """Per quantized setup on the perplexity task: the token-level KL and Δp distribution, as
    llama.cpp's --kl-divergence reports it, consistent with the mean KL and top-1 agreement."""
    import qeval

    out, results = demo_run
    for name in ("int4", "kv-int4", "kv-int2"):
        c = _setup(results, name)["vs_baseline"]["ppl"]
        d = c["kl_distribution"]
        records = [json.loads(x) for x in (out / "samples" / name / "ppl.jsonl").read_text().splitlines()]
        assert d["tokens"] == sum(r["kl_tokens"] for r in records)
        assert d["kl_mean"] == pytest.approx(c["kl"], rel=1e-6) and d["same_top1"] == pytest.approx(c["top1_agreement"])
        assert 0 <= d["kl_median"] <= d["kl_p90"] <= d["kl_p99"] <= d["kl_p99_9"] <= d["kl_max"]
        assert -1 <= d["dp_min"] <= d["dp_p1"] <= d["dp_median"] <= d["dp_p99"] <= d["dp_max"] <= 1
        assert d["dp_rms"] >= abs(d["dp_mean"])
    for name in ("int4", "kv-int2"):  # the scored tokens of every choice of a multiple-choice task
        c = _setup(results, name)["vs_baseline"]["compare_mc"]
        d = c["kl_distribution"]
        records = [json.loads(x) for x in (out / "samples" / name / "compare_mc.jsonl").read_text().splitlines()]
        assert d["tokens"] == sum(r["kl_tokens"] for r in records) > len(records)
        assert d["kl_mean"] == pytest.approx(c["kl"], rel=1e-6) and d["kl_mean"] > 0
        assert 0 <= d["kl_median"] <= d["kl_p99"] <= d["kl_max"] and 0 <= d["same_top1"] <= 1
    assert "## KL divergence to the baseline" in (out / "report.md").read_text()
    assert 'id="kl"' in (out / "report.html").read_text()
    table = qeval.load_run(out).kl()
    assert set(table["setup"]) >= {"int4", "kv-int4", "kv-int2"} and "kl_p99_9" in table.columns


def test_generated_length_per_setup_and_its_ratio_to_the_baseline(demo_run: tuple[Path, dict]) -> None:
    """Each generation task's mean generated tokens, from its records (each between 1 and the
    task's max_gen_toks), and the report's table with each setup's ratio to the baseline."""
    out, results = demo_run
    base = _setup(results, "bf16")["tasks"]
    md = (out / "report.md").read_text()
    assert "## Generated length" in md
    for s in results["setups"]:
        for task, score in s["tasks"].items():
            records = [json.loads(x) for x in (out / "samples" / s["name"] / f"{task}.jsonl").read_text().splitlines()]
            if task not in ("addition", "facts"):  # not generation tasks: nothing measured
                assert score["generated_tokens"] is None and all(r.get("generated_tokens") is None for r in records)
                continue
            lengths = [r["generated_tokens"] for r in records]
            assert all(1 <= n <= 6 for n in lengths), lengths  # max_gen_toks: 6
            assert score["generated_tokens"] == pytest.approx(sum(lengths) / len(lengths))
            ratio = "—" if s["name"] == "bf16" else f"{score['generated_tokens'] / base[task]['generated_tokens']:.2f}x"
            assert f"| {s['name']} | {task} | {score['generated_tokens']:.1f} | {ratio} |" in md
