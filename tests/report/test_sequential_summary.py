"""The summary table of a sequential run (qeval/report/sequential_gates.py `fewer_documents`): a
setup that stopped a task early shows its score with the documents it is on, since the baseline's
score beside it is on more (the stored v1 run, made sequential by hand: no model)."""

from __future__ import annotations

import io

from rich.console import Console

from qeval.report.markdown import print_summary, render_markdown
from qeval.results.schema import Results, read_results
from qeval.results.sequential import SequentialRun
from tests.helpers import ROOT

V1 = ROOT / "tests" / "data" / "run-v1" / "results.json"


def _stopped(results: Results, setup: str, task: str, n: int) -> Results:
    """`results` with `setup` having scored `n` documents of `task`, and a (cell-less) sequential block."""
    setups = []
    for s in results.setups:
        if s.name == setup:
            tasks = s.tasks | {task: s.tasks[task].model_copy(update={"n": n})}
            s = s.model_copy(update={"tasks": tasks})
        setups.append(s)
    block = SequentialRun(
        method="m",
        level=0.05,
        cell_level=0.05,
        min_docs=6,
        chunk_docs=4,
        max_docs=None,
        seed=0,
        cells=[],
        documents=0,
        total=0,
    )
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
