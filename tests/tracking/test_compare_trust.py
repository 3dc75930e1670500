"""What `qeval compare` needs before it says "no regression" (docs/guarantees.md): every setup
and task of the reference checked, records that are what results.json reports and belong to
its run, no run in progress, chat settings compared, malformed records and outputs refused in
one line. One real tiny-model run per module; each test edits a copy of it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qeval.records.keys import key_of
from qeval.run.rundir import take_run_dir
from tests.helpers import MODEL, ROOT, TASKS, one_line_exit_2, run_cli

V1 = ROOT / "tests" / "data" / "run-v1"
CONFIG = f"""name: trust
model: {{path: {MODEL}, dtype: auto, max_context: 256}}
backend: hf
device: cpu
batch_size: 8
tasks_dir: {TASKS}
setups:
  - {{name: bf16, baseline: true}}
  - {{name: int8, weights: int8}}
tasks: [compare_mc, ppl]
"""


def qeval_run(tmp: Path, name: str, extra: str = "", *args: str) -> Path:
    (tmp / f"{name}.yaml").write_text(CONFIG + extra)
    out = tmp / name
    res = run_cli(
        "run", str(tmp / f"{name}.yaml"), "--output", str(out), "--limit", "8", "--no-performance", *args, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of two setups on two tasks, 8 documents each (its metas hold key parts)."""
    return qeval_run(tmp_path_factory.mktemp("fresh"), "fresh")


def copy_of(run: Path, tmp: Path, name: str = "copy") -> Path:
    shutil.copytree(run, tmp / name)
    return tmp / name


def edit_json(path: Path, change: Callable[[Any], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def compare(tmp: Path, *runs: Path, margin: str | None = "0.02") -> tuple[Any, dict[str, Any], str]:
    out = tmp / "cmp"
    res = run_cli(
        "compare",
        *map(str, runs),
        "--output",
        str(out),
        *(["--fail-on-regression", margin] if margin else []),
        timeout=300,
    )
    if res.returncode == 2:
        return res, {}, ""
    return res, json.loads((out / "compare.json").read_text()), (out / "compare.md").read_text()


def row(report: dict[str, Any], setup: str, task: str) -> dict[str, Any]:
    pair = next(p for p in report["comparisons"][0]["setups"] if p["setup"] == setup)
    return next(t for t in pair["tasks"] if t["task"] == task)


def test_a_genuine_run_against_itself_passes_with_every_check(tmp_path: Path, fresh: Path) -> None:
    """The checks raise nothing on a run as qeval writes it: key parts, metas, records agree."""
    res, report, _ = compare(tmp_path, fresh, copy_of(fresh, tmp_path))
    assert res.returncode == 0, res.stderr
    assert report["gate"] == "pass" and report["unchecked"] == [] and report["regressions"] == []
    assert all(t["paired"] and t["problem"] is None for p in report["comparisons"][0]["setups"] for t in p["tasks"])
    assert "no regression beyond 0.02" in res.stderr


@pytest.mark.parametrize("left_out", ["setup", "task"])
def test_what_the_reference_holds_and_this_run_did_not_score_fails_the_gate(
    tmp_path: Path, fresh: Path, left_out: str
) -> None:
    """Point 4: a run of `--setups bf16` or `--tasks compare_mc` against the full run."""
    part = copy_of(fresh, tmp_path)

    def leave_out(d: dict[str, Any]) -> None:
        if left_out == "setup":
            d["setups"] = [s for s in d["setups"] if s["name"] == "bf16"]
        else:
            del d["tasks"]["ppl"]
            for s in d["setups"]:
                s["tasks"].pop("ppl")
                s["vs_baseline"].pop("ppl", None)

    edit_json(part / "results.json", leave_out)
    res, report, md = compare(tmp_path, fresh, part)
    assert res.returncode == 4, res.stderr
    assert report["gate"] == "unchecked" and report["regressions"] == []
    if left_out == "setup":
        assert report["unchecked"] == ["copy: int8: ok in the reference run, not scored in this one"]
    else:
        assert sorted(report["unchecked"]) == [f"copy: {s} · ppl: not among this run's tasks" for s in ("bf16", "int8")]
        assert row(report, "int8", "ppl")["verdict"] == "unchecked"  # a row, not silence
    assert "**Not checked (2; the gate fails):**" in md or "**Not checked (1; the gate fails):**" in md
    assert "qeval: not checked: copy:" in res.stderr and "no regression beyond 0.02\n" not in res.stderr


def test_records_cut_short_are_not_evidence(tmp_path: Path, fresh: Path) -> None:
    """Point 4: a samples file cut to 3 lines while results.json says n = 8."""
    cut = copy_of(fresh, tmp_path)
    path = cut / "samples" / "int8" / "compare_mc.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    res, report, _ = compare(tmp_path, fresh, cut)
    assert res.returncode == 4, res.stderr
    t = row(report, "int8", "compare_mc")
    assert t["verdict"] == "unchecked" and t["delta"] is None
    assert "holds 3 records, results.json says n = 8" in t["problem"]


def test_records_that_disagree_with_results_json_are_flagged(tmp_path: Path, fresh: Path) -> None:
    """Point 4: results.json says 30% where the records (and their meta) say what they scored."""
    edited = copy_of(fresh, tmp_path)
    edit_json(
        edited / "results.json", lambda d: d["setups"][1]["tasks"]["compare_mc"]["metrics"]["acc"].update(value=0.3)
    )
    res, report, md = compare(tmp_path, fresh, edited)
    assert res.returncode == 4, res.stderr
    t = row(report, "int8", "compare_mc")
    assert t["delta"] is None and t["value_b"] == 0.3  # no delta from records results.json contradicts
    assert "the records give acc 100.0, results.json reports 30.0" in t["problem"]
    assert "is not what results.json reports" in t["problem"]
    # without the gate: exit 0, but said on stderr and in the row
    res, report, md = compare(tmp_path, fresh, edited, margin=None)
    assert res.returncode == 0 and "qeval: warning: not checked: copy: int8 · compare_mc" in res.stderr
    assert "not checked: this run: " in md


def test_records_of_another_run_are_not_paired_with_these_results(tmp_path: Path, fresh: Path) -> None:
    """Point 5: a copy rerun with another batch size and killed after the baseline was rescored
    leaves the old results.json beside the baseline's new records and metas."""
    mixed = copy_of(fresh, tmp_path)
    for task in ("compare_mc", "ppl"):

        def rescored(meta: dict[str, Any]) -> None:
            meta["key_parts"]["batch_size"] = "4"
            meta["key"] = key_of(meta["key_parts"])

        edit_json(mixed / "samples" / "bf16" / f"{task}.meta.json", rescored)
    res, report, _ = compare(tmp_path, fresh, mixed)
    assert res.returncode == 4, res.stderr
    t = row(report, "bf16", "ppl")
    assert t["delta"] is None and "batch_size 4 (results.json: 8)" in t["problem"]
    assert "belong to another run" in t["problem"]
    assert row(report, "int8", "ppl")["problem"] is None


def test_a_run_in_progress_is_not_compared(tmp_path: Path, fresh: Path) -> None:
    """Point 5: the run's lock held (a `qeval run` writing it): refused, nothing written."""
    busy = copy_of(fresh, tmp_path)
    lock = take_run_dir(busy, "trust", force=False)
    try:
        res, _, _ = compare(tmp_path, fresh, busy)
    finally:
        lock.release()
    one_line_exit_2(res, "is writing to it")
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize(
    ("task", "field", "value", "expected"),
    [
        ("compare_mc", "sample_id", None, "no sample_id"),
        ("compare_mc", "sample_id", ["a"], "sample_id must be a string, not list"),
        ("compare_mc", "correct", "abc", "correct must be a number or true/false, not str"),
        ("compare_mc", "correct", -50, "correct is -50, not between 0 and 1"),
        ("ppl", "nll", float("nan"), "nll is nan, not a finite number"),
    ],
)
def test_malformed_records_are_one_line_and_leave_the_last_comparison_whole(
    tmp_path: Path, fresh: Path, task: str, field: str, value: Any, expected: str
) -> None:
    """Point 6: one line naming the file and line, exit 2; compare.md, .html and .json are
    still the last comparison's, all three."""
    bad = copy_of(fresh, tmp_path)
    res, _, _ = compare(tmp_path, fresh, bad)
    assert res.returncode == 0, res.stderr
    before = {p.name: p.read_bytes() for p in (tmp_path / "cmp").iterdir()}
    path = bad / "samples" / "int8" / f"{task}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if value is None:
        del rows[1][field]
    else:
        rows[1][field] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res, _, _ = compare(tmp_path, fresh, bad)
    one_line_exit_2(res, f"{path}:2: malformed record: {expected}")
    assert {p.name: p.read_bytes() for p in (tmp_path / "cmp").iterdir()} == before


@pytest.mark.parametrize(("where", "expected"), [("file", "exists and is not a folder"), ("proc", "cannot create it")])
def test_an_output_that_cannot_hold_the_comparison_is_one_line(tmp_path: Path, where: str, expected: str) -> None:
    """Point 7."""
    out = tmp_path / "taken.md" if where == "file" else Path("/proc/qeval-compare")
    if where == "file":
        out.write_text("mine")
    res = run_cli("compare", str(V1), str(V1), "--output", str(out))
    one_line_exit_2(res, expected)
    assert where != "file" or out.read_text() == "mine"


def test_a_chat_run_is_not_paired_with_a_plain_one(tmp_path: Path, fresh: Path) -> None:
    """Point 13: a system prompt is in neither the task's data fingerprint nor results.json's
    task entry; compare reads the run's chat settings and compares unpaired, and says why."""
    chat = qeval_run(
        tmp_path,
        "chat",
        "system_prompt: Answer with the smallest number.\n",
        "--setups",
        "bf16",
        "--tasks",
        "compare_mc",
    )
    res, report, md = compare(tmp_path, fresh, chat, margin=None)
    assert res.returncode == 0, res.stderr
    t = row(report, "bf16", "compare_mc")
    ref = json.loads((fresh / "results.json").read_text())["tasks"]["compare_mc"]["fingerprint"]
    assert json.loads((chat / "results.json").read_text())["tasks"]["compare_mc"]["fingerprint"] == ref
    assert not t["paired"] and t["unpaired_reason"] == "prompted under different chat settings (system_prompt)"
    assert "unpaired: prompted under different chat settings" in md


def test_minor_margin_nan_arrow_and_link_messages(tmp_path: Path) -> None:
    """`--fail-on-regression nan` is one clear line; a changed spec id reads `→` in compare.md,
    not an escaped `-&gt;`; a samples link out of the run is refused without saying "write"."""
    res = run_cli("compare", str(V1), str(V1), "--output", str(tmp_path / "cmp"), "--fail-on-regression", "nan")
    one_line_exit_2(res, "--fail-on-regression nan: expected a finite number >= 0")
    changed = copy_of(V1, tmp_path)
    edit_json(changed / "results.json", lambda d: d["setups"][1]["spec"].update(id="0123456789abcdef"))
    res, _, md = compare(tmp_path, V1, changed, margin=None)
    assert res.returncode == 0, res.stderr
    assert "→ 0123456789abcdef)" in md and "&gt;" not in md
    outside = tmp_path / "elsewhere.jsonl"
    shutil.copy(V1 / "samples" / "int8" / "ppl.jsonl", outside)
    (changed / "samples" / "int8" / "ppl.jsonl").unlink()
    (changed / "samples" / "int8" / "ppl.jsonl").symlink_to(outside)
    res, _, _ = compare(tmp_path, V1, changed, margin=None)
    one_line_exit_2(res, "resolves outside the run directory")
    assert "write" not in res.stderr


def test_a_file_nested_thousands_deep_is_one_line(tmp_path: Path) -> None:
    """A record, meta file or results.json nested 100,000 deep (json's decoder recurses) is one
    UserError naming the file, not a RecursionError traceback (issue 40 review, point 6)."""
    from qeval.errors import UserError
    from qeval.files.atomic import read_json
    from qeval.files.jsonl import read_objects
    from qeval.results.schema import read_results

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "s.jsonl").write_text('{"sample_id": "a", "correct": 1}\n{"sample_id": "b", "x": ' + deep + "}\n")
    (tmp_path / "m.json").write_text(deep)
    (tmp_path / "results.json").write_text('{"schema_version": ' + deep + "}")
    with pytest.raises(UserError, match=r"s\.jsonl:2: .*nested too deeply"):
        list(read_objects(tmp_path / "s.jsonl"))
    with pytest.raises(UserError, match=r"m\.json: .*nested too deeply"):
        read_json(tmp_path / "m.json")
    with pytest.raises(UserError, match=r"results\.json: .*nested too deeply"):
        read_results(tmp_path / "results.json")


def test_a_pass_says_what_it_did_not_rule_out(tmp_path: Path, fresh: Path) -> None:
    """Three of int8's right answers made wrong (acc -37.5 points on 8 documents, records, meta and
    results.json agreeing): the interval [-69, +3] reaches past the margin without lying beyond
    it, so the gate passes (it fails on "worse"); it said "no regression beyond 0.02", as if one
    had been ruled out. It names what it could not rule out (issue 40 review, point 4)."""
    run = copy_of(fresh, tmp_path)
    path = run / "samples" / "int8" / "compare_mc.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    right = [r for r in records if r["correct"]]
    assert len(right) >= 3
    for r in right[:3]:
        r["correct"] = 0
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    acc = sum(float(r["correct"]) for r in records) / len(records)
    edit_json(path.with_name("compare_mc.meta.json"), lambda m: m["metrics"]["acc"].update(value=acc))
    edit_json(
        run / "results.json",
        lambda d: next(s for s in d["setups"] if s["name"] == "int8")["tasks"]["compare_mc"]["metrics"]["acc"].update(
            value=acc
        ),
    )
    res, report, _ = compare(tmp_path, fresh, run)
    assert res.returncode == 0 and report["gate"] == "pass", res.stderr
    assert row(report, "int8", "compare_mc")["verdict"] == "inconclusive"
    assert "none ruled out on" in res.stderr and "copy: int8 · compare_mc" in res.stderr
