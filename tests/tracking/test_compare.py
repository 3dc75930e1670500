"""`qeval compare` on stored runs (tests/data/run-v1 and edited copies of it): paired where the
data match, unpaired and said so where not, the provenance diff, the history, the regression
gate's exit codes, bad and hostile input. The statistics are analysis/'s: checked here against
published values and scipy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as sps

from qeval.analysis.stats import newcombe_paired_ci, newcombe_unpaired_ci, unpaired_difference
from tests.helpers import ROOT, one_line_exit_2, run_cli

V1 = ROOT / "tests" / "data" / "run-v1"


def copy_run(tmp: Path, name: str) -> Path:
    out = tmp / name
    shutil.copytree(V1, out)
    return out


def edit_results(run: Path, change: Any) -> None:
    data = json.loads((run / "results.json").read_text())
    change(data)
    (run / "results.json").write_text(json.dumps(data))


def flip_to_wrong(run: Path, setup: str, task: str, keep: int = 0) -> int:
    """Every right answer of `setup` on `task` made wrong, but the first `keep`; how many flipped.
    The meta file and results.json are made to report the new accuracy, as a run that scored
    these answers would (compare refuses records that are not what results.json reports)."""
    path = run / "samples" / setup / f"{task}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    flipped = 0
    for r in rows:
        if r["correct"] and keep <= 0:
            r["correct"], flipped = False, flipped + 1
        elif r["correct"]:
            keep -= 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report_accuracy(run, setup, task, sum(r["correct"] for r in rows) / len(rows))
    return flipped


def report_accuracy(run: Path, setup: str, task: str, acc: float) -> None:
    """`setup`'s accuracy on `task` as its meta file and results.json report it."""
    meta_path = run / "samples" / setup / f"{task}.meta.json"
    meta = json.loads(meta_path.read_text())
    metric = "acc" if "acc" in meta["metrics"] else "exact_match"
    meta["metrics"][metric]["value"] = acc
    meta_path.write_text(json.dumps(meta))
    edit_results(
        run,
        lambda d: next(s for s in d["setups"] if s["name"] == setup)["tasks"][task]["metrics"][metric].update(
            value=acc
        ),
    )


def compare(tmp: Path, *runs: Path, margin: str | None = None) -> tuple[Any, dict[str, Any], str, str]:
    out = tmp / "cmp"
    args = ["compare", *map(str, runs), "--output", str(out)] + (["--fail-on-regression", margin] if margin else [])
    res = run_cli(*args, timeout=300)
    if res.returncode == 2:
        return res, {}, "", ""
    return (
        res,
        json.loads((out / "compare.json").read_text()),
        (out / "compare.md").read_text(),
        (out / "compare.html").read_text(),
    )


def delta(report: dict[str, Any], setup: str, task: str, which: int = 0) -> dict[str, Any]:
    pair = next(p for p in report["comparisons"][which]["setups"] if p["setup"] == setup)
    return next(t for t in pair["tasks"] if t["task"] == task)


def test_a_run_against_itself_is_paired_and_passes(tmp_path: Path) -> None:
    res, report, md, html = compare(tmp_path, V1, V1, margin="0.02")
    assert res.returncode == 0, res.stderr
    assert report["regressions"] == [] and "no regression beyond 0.02" in res.stderr
    results = json.loads((V1 / "results.json").read_text())
    for s in results["setups"]:
        for task, score in s["tasks"].items():
            t = delta(report, s["name"], task)
            assert t["paired"] and t["method"].startswith("paired, ") and t["n_paired"] == score["n"]
            assert t["delta"] == 0 and t["ci"][0] <= 0 <= t["ci"][1]
            assert t["verdict"] != "worse"
            metric = results["tasks"][task].get("metric") or t["metric"]
            assert t["value_a"] == pytest.approx(score["metrics"][metric]["value"], abs=1e-9)
    assert report["comparisons"][0]["changes"] == []
    assert "Nothing the runs recorded differs" in md and '<table class="deltas">' in html


def test_paired_delta_is_the_same_statistic_a_setup_gets_against_its_baseline(tmp_path: Path) -> None:
    """bf16 of a copy whose bf16 answers are kv-int2's: the delta and flips are those results.json
    holds for kv-int2 against bf16 (the same documents), the interval Newcombe's paired one on
    the 2x2 table of the documents' outcomes (results.json's was a bootstrap when it was written)."""
    other = copy_run(tmp_path, "b")
    for task in ("compare_mc", "addition"):
        for part in ("jsonl", "meta.json"):  # the records and the meta that marks them stored
            shutil.copy(V1 / "samples" / "kv-int2" / f"{task}.{part}", other / "samples" / "bf16" / f"{task}.{part}")

    def scores_of_kv_int2(d: dict[str, Any]) -> None:
        setups = {s["name"]: s for s in d["setups"]}
        setups["bf16"]["tasks"] |= {t: setups["kv-int2"]["tasks"][t] for t in ("compare_mc", "addition")}

    edit_results(other, scores_of_kv_int2)
    _, report, _, _ = compare(tmp_path, V1, other)
    results = json.loads((V1 / "results.json").read_text())
    kv = next(s for s in results["setups"] if s["name"] == "kv-int2")
    for task in ("compare_mc", "addition"):
        t, ref = delta(report, "bf16", task), kv["vs_baseline"][task]
        assert t["delta"] == pytest.approx(ref["delta"]) and t["delta"] < 0
        assert (t["flips_to_wrong"], t["flips_to_right"]) == (ref["flips_to_wrong"], ref["flips_to_right"])
        a = {
            r["sample_id"]: r["correct"]
            for r in map(json.loads, (V1 / "samples" / "bf16" / f"{task}.jsonl").read_text().splitlines())
        }
        b = {
            r["sample_id"]: r["correct"]
            for r in map(json.loads, (V1 / "samples" / "kv-int2" / f"{task}.jsonl").read_text().splitlines())
        }
        table = [
            sum(1 for i in a if (a[i], b[i]) == cell)
            for cell in ((True, True), (True, False), (False, True), (False, False))
        ]
        assert t["ci"] == pytest.approx(newcombe_paired_ci(*table)) and t["method"] == "paired, newcombe"


def test_a_constructed_regression_exits_3(tmp_path: Path) -> None:
    worse = copy_run(tmp_path, "worse")
    assert flip_to_wrong(worse, "int8", "compare_mc") >= 20
    res, report, md, _ = compare(tmp_path, V1, worse, margin="0.02")
    assert res.returncode == 3, res.stderr
    t = delta(report, "int8", "compare_mc")
    assert t["verdict"] == "worse" and t["ci"][1] < -0.02
    assert [r for r in report["regressions"] if "int8 · compare_mc" in r] == report["regressions"]
    assert "qeval: regression: worse: int8 · compare_mc" in res.stderr
    assert "**Regressions beyond 0.02:** worse: int8 · compare_mc" in md
    # the same runs without the gate: compared, exit 0
    res, report, _, _ = compare(tmp_path, V1, worse)
    assert res.returncode == 0 and report["regressions"] == []
    assert delta(report, "int8", "compare_mc")["verdict"] is None


def test_a_drop_inside_the_interval_is_not_a_regression(tmp_path: Path) -> None:
    """Two answers of 24 flipped: a real drop, but 95% confidence does not put it beyond 2 points."""
    slightly = copy_run(tmp_path, "slightly")
    rows = (V1 / "samples" / "int8" / "compare_mc.jsonl").read_text().splitlines()
    right = sum(json.loads(r)["correct"] for r in rows)
    assert flip_to_wrong(slightly, "int8", "compare_mc", keep=right - 2) == 2
    res, report, _, _ = compare(tmp_path, V1, slightly, margin="0.02")
    t = delta(report, "int8", "compare_mc")
    assert res.returncode == 0, res.stderr
    assert t["delta"] == pytest.approx(-2 / 24) and t["verdict"] == "inconclusive"


def test_other_data_is_compared_unpaired_and_said_so(tmp_path: Path) -> None:
    changed = copy_run(tmp_path, "changed")
    flip_to_wrong(changed, "int8", "compare_mc")
    edit_results(changed, lambda d: d["tasks"]["compare_mc"].update(fingerprint="0000changed0000"))
    res, report, md, _ = compare(tmp_path, V1, changed, margin="0.02")
    t = delta(report, "int8", "compare_mc")
    assert not t["paired"] and t["method"] == "unpaired, newcombe" and t["n_paired"] is None
    assert "different documents or prompting" in t["unpaired_reason"]
    assert "unpaired: different documents or prompting" in md
    assert res.returncode == 3 and t["verdict"] == "worse"  # 24 of 24 -> 0 of 24: beyond doubt, even unpaired
    assert delta(report, "int8", "addition")["paired"]  # the other tasks' data did not change
    change = next(c for c in report["comparisons"][0]["changes"] if c["what"] == "tasks.compare_mc.fingerprint")
    assert change["b"] == "0000changed0000"


def test_unpaired_perplexity_is_welch(tmp_path: Path) -> None:
    changed = copy_run(tmp_path, "ppl")
    edit_results(changed, lambda d: d["tasks"]["ppl"].update(fingerprint="ffff"))
    _, report, _, _ = compare(tmp_path, V1, changed)
    t = delta(report, "kv-int2", "ppl")
    assert t["method"] == "unpaired, welch" and t["delta"] == pytest.approx(0, abs=1e-12)
    assert t["ci"][0] < -0.01 < 0.01 < t["ci"][1]  # unpaired: the documents' spread, not their differences


def test_provenance_diff_names_what_changed(tmp_path: Path) -> None:
    other = copy_run(tmp_path, "upgraded")

    def upgrade(d: dict[str, Any]) -> None:
        d["run"]["qeval_version"] = "0.2.0"
        d["run"]["model_sha256"] = "f" * 64
        d["config"]["batch_size"] = 16
        for s in d["setups"]:
            s["library_versions"]["transformers"] = "9.9.9"

    edit_results(other, upgrade)
    res, report, md, html = compare(tmp_path, V1, other)
    assert res.returncode == 0, res.stderr
    changes = {c["what"]: (c["a"], c["b"]) for c in report["comparisons"][0]["changes"]}
    assert changes["run.qeval_version"] == ("0.1.0", "0.2.0")
    assert changes["run.model_sha256"][1] == "f" * 64
    assert changes["config.batch_size"] == ("64", "16")
    old = json.loads((V1 / "results.json").read_text())["setups"][0]["library_versions"]["transformers"]
    assert changes["setups.bf16.version.transformers"] == (old, "9.9.9")
    assert "run.finished" not in changes and "config.batch_size" in md and "config.batch_size" in html


def test_history_orders_runs_by_time(tmp_path: Path) -> None:
    runs = []
    for i, (day, acc) in enumerate([("2026-12-03", 0.5), ("2026-12-01", 1.0), ("2026-12-02", 0.75)]):
        run = copy_run(tmp_path, f"r{i}")

        def stamp(d: dict[str, Any], day: str = day, acc: float = acc) -> None:
            d["run"]["finished"] = f"{day}T00:00:00+00:00"
            next(s for s in d["setups"] if s["name"] == "int4")["tasks"]["compare_mc"]["metrics"]["acc"]["value"] = acc

        edit_results(run, stamp)
        runs.append(run)
    res, report, md, html = compare(tmp_path, *runs)
    assert res.returncode == 0, res.stderr
    h = report["history"]
    assert [label.split(" ")[0] for label in h["runs"]] == ["r1", "r2", "r0"]
    assert h["values"]["compare_mc"]["int4"] == [1.0, 0.75, 0.5]
    assert len(report["comparisons"]) == 2  # each later run against the first given
    section = md[md.index("### compare_mc") :]
    assert section.index("| r1 (") < section.index("| r2 (") < section.index("| r0 (")
    assert "<svg" in html and '<figure class="plot">' in html


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((48, 80), (56, 70), (0.0524, 0.3339)),
        ((3, 10), (9, 10), (0.1705, 0.8090)),
        ((2, 7), (6, 7), (0.0582, 0.8062)),
        ((0, 29), (5, 56), (-0.0381, 0.1926)),
    ],
)
def test_newcombe_unpaired_matches_the_published_examples(
    a: tuple[int, int], b: tuple[int, int], expected: tuple[float, float]
) -> None:
    """Newcombe (1998), "Interval estimation for the difference between independent proportions",
    Table II, method 10, examples (a) to (d): b - a."""
    lo, hi = newcombe_unpaired_ci(*a, *b)
    assert (round(lo, 4), round(hi, 4)) == expected


def test_welch_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 0.3, 40), rng.normal(1.2, 0.6, 25)
    d = unpaired_difference(a, b, "score")
    ref = sps.ttest_ind(b, a, equal_var=False)
    assert d.method == "welch" and d.p_value == pytest.approx(ref.pvalue)
    assert d.ci == pytest.approx(tuple(ref.confidence_interval(0.95)))


@pytest.mark.parametrize("case", ["missing", "not_a_run", "corrupt", "other_schema", "one_run", "hostile_name"])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    target = tmp_path / "bad"
    expected = {
        "missing": "not found",
        "not_a_run": "not a qeval run directory",
        "corrupt": "corrupt JSON",
        "other_schema": "schema_version 7",
        "one_run": "at least two run directories",
        "hostile_name": "is not allowed",
    }[case]
    if case == "not_a_run":
        target.mkdir()
        (target / "notes.txt").write_text("x")
    elif case == "corrupt":
        copy_run(tmp_path, "bad")
        (target / "results.json").write_text('{"schema_version": 1, ')
    elif case == "other_schema":
        copy_run(tmp_path, "bad")
        edit_results(target, lambda d: d.update(schema_version=7))
    elif case == "hostile_name":
        copy_run(tmp_path, "bad")
        edit_results(target, lambda d: d["setups"][1].update(name="../../../etc"))
    runs = [str(V1)] if case == "one_run" else [str(V1), str(target)]
    res = run_cli("compare", *runs, "--output", str(tmp_path / "cmp"))
    one_line_exit_2(res, expected)
    assert not (tmp_path / "cmp").exists()


def test_html_escapes_what_the_runs_recorded(tmp_path: Path) -> None:
    other = copy_run(tmp_path, "hostile")
    payload = "<script>alert(1)</script>"

    def poison(d: dict[str, Any]) -> None:
        d["run"]["name"] = payload
        d["config"]["model"]["path"] = payload
        d["setups"][0]["library_versions"]["torch"] = payload

    edit_results(other, poison)
    res, _, md, html = compare(tmp_path, V1, other)
    assert res.returncode == 0, res.stderr
    assert payload not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert payload not in md and "&lt;script&gt;" in md
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["compare.html", "compare.json", "compare.md"]
