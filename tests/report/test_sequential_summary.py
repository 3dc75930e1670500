"""The summary table of a sequential run (qeval/report/sequential_gates.py `fewer_documents`): a
setup that stopped a task early shows its score with the documents it is on, since the baseline's
score beside it is on more (the stored v1 run, made sequential by hand: no model)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from qeval.report.markdown import print_summary, render_markdown
from qeval.results.schema import Results, read_results
from tests.helpers import ROOT, empty_sequential_block

V1 = ROOT / "tests" / "data" / "run-v1" / "results.json"


def _stopped(results: Results, setup: str, task: str, n: int) -> Results:
    """`results` with `setup` having scored `n` documents of `task`, and a (cell-less) sequential block."""
    setups = []
    for s in results.setups:
        if s.name == setup:
            tasks = s.tasks | {task: s.tasks[task].model_copy(update={"n": n})}
            s = s.model_copy(update={"tasks": tasks})
        setups.append(s)
    block = empty_sequential_block()
    return results.model_copy(update={"setups": setups, "sequential": block})


def test_a_stopped_task_shows_the_documents_its_score_is_on() -> None:
    plain = read_results(V1)
    seq = _stopped(plain, "int8", "compare_mc", 12)
    md = render_markdown(seq)
    int8 = next(line for line in md.splitlines() if line.startswith("| int8 |"))
    assert "(on 12 of 24 documents)" in int8 and md.count("documents) |") == 1  # that cell only
    out = io.StringIO()
    print_summary(seq, Console(file=out, width=300))
    assert "(on 12 of 24 documents)" in out.getvalue()
    # a run without the switch reads as before, even where a setup scored fewer documents
    assert "(on 12 of 24" not in render_markdown(
        _stopped(plain, "int8", "compare_mc", 12).model_copy(update={"sequential": None})
    )
    assert "documents)" not in render_markdown(plain)


def test_a_failed_baseline_claims_no_saving_and_a_stopped_score_says_its_documents() -> None:
    """Where the baseline failed, the other setups stopped at pass 1's horizon with no cell tested:
    the report claims no saving, and a setup's score short of the task's documents says it is on
    fewer (there is no baseline score to compare with); a failed setup's documents count on
    neither side (analysis/sequential_run.py `documents_scored`)."""
    from qeval.analysis.sequential_run import documents_scored
    from qeval.report.sequential_gates import summary

    plain = read_results(V1)
    setups = []
    for s in _stopped(plain, "int8", "compare_mc", 12).setups:
        if s.baseline or s.name == "int4":  # the baseline, and int4, failed: no scores
            s = s.model_copy(update={"status": "failed", "tasks": {}, "error": "out of memory"})
        setups.append(s)
    seq = _stopped(plain, "int8", "compare_mc", 12).model_copy(update={"setups": setups})
    n_docs = {t: i.n for t, i in seq.tasks.items()}
    scored, full = documents_scored(seq.setups, {}, n_docs)
    assert (scored, full) == (3 * 4 * 24 - 12, 3 * 4 * 24)  # int8, kv-int4, kv-int2: ok; bf16, int4: failed
    block = seq.sequential.model_copy(update={"documents": scored, "total": full})  # type: ignore[union-attr]
    seq = seq.model_copy(update={"sequential": block})
    line = summary(seq)
    assert "saved" not in line and "no cell was tested" in line and "no saving" in line
    md = render_markdown(seq)
    int8 = next(line for line in md.splitlines() if line.startswith("| int8 |"))
    assert "(on 12 of 24 documents)" in int8 and md.count("documents) |") == 1
    assert "The verdicts of these cells" not in md  # no cell: no legend about cells
    # the cap: a task stored whole up to max_docs reads as whole
    capped = seq.model_copy(update={"sequential": block.model_copy(update={"max_docs": 12})})
    assert "(on 12 of" not in render_markdown(capped)
    # every document scored: nothing short, nothing said about a saving
    whole = seq.model_copy(update={"sequential": block.model_copy(update={"documents": full})})
    assert summary(whole).endswith("(no setup was compared with the baseline).")


def test_load_run_summary_gives_the_documents_each_score_is_on(tmp_path: Path) -> None:
    """load_run(...).summary() has `n` beside each score: a stopped setup's score (12 documents)
    sits next to the baseline's (24) in the frame, and without it a notebook reads them as alike."""
    import shutil

    import qeval

    run = tmp_path / "run"
    shutil.copytree(V1.parent, run)
    seq = _stopped(read_results(V1), "int8", "compare_mc", 12)
    (run / "results.json").write_text(seq.model_dump_json(indent=2))
    frame = qeval.load_run(run).summary().set_index(["setup", "task"])
    assert frame.loc[("int8", "compare_mc"), "n"] == 12 and frame.loc[("bf16", "compare_mc"), "n"] == 24
