"""qeval's exit codes (docs/architecture.md §7), and what `qeval run` says and exits with once its
runs finished: the failed setups, the dropped results, a gate the candidate misses, and the
verdict line last."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from qeval.analysis.recommend import candidate_problem

if TYPE_CHECKING:
    from qeval.results.schema import Results

EXIT_OK = 0  # every setup scored (and, under --fail-on-gate, the candidate passes every gate)
EXIT_SETUP_FAILED = 1  # a setup (the baseline included) failed: the comparison is incomplete
EXIT_BAD_INPUT = 2  # bad input, refused before any model loaded; nothing written
EXIT_GATE_FAILED = 3  # --fail-on-gate: every setup scored, but the candidate does not pass every gate
EXIT_NONE_MEETS_SLO = 3  # goodput: no setup recommended (none meets the SLO, or none was served)
EXIT_NOT_CHECKED = 4  # compare --fail-on-regression: no regression found, but not everything could be checked
EXIT_INTERRUPTED = 130  # Ctrl-C: rerun the same command to resume


def exit_code(results: Results, fail_on_gate: bool) -> int:
    """0, 1 or 3 for a run that finished (2 and 130 are decided before it finishes)."""
    if any(s.status != "ok" for s in results.setups):
        return EXIT_SETUP_FAILED
    if fail_on_gate and candidate_problem(results):
        return EXIT_GATE_FAILED
    return EXIT_OK


def finished(runs: dict[str, Results], out: Path, sweep: bool, fail_on_gate: bool) -> int:
    """After `qeval run`'s runs (one, or a sweep's per model: `runs` by model, "" for one) and
    their tracking: where the files are, what went wrong on stderr, the verdict lines last; the
    exit code, 1 over 3 over 0."""
    from qeval.report.markdown import verdict_line

    err = Console(stderr=True)
    first = f"sweep:   {out / 'sweep.json'}" if sweep else f"results: {out / 'results.json'}"
    err.print(escape(f"{first}\nreport:  {out / 'report.md'}"))
    codes = []
    for model, results in runs.items():
        where = f"{model}: " if model else ""
        codes.append(exit_code(results, fail_on_gate))
        failed_setups = [s.name for s in results.setups if s.status != "ok"]
        if failed_setups:
            err.print(
                f"[yellow]{escape(where)}setups that failed: {escape(', '.join(failed_setups))} "
                "(see results.json)[/yellow]"
            )
        if results.dropped:
            err.print(
                f"[yellow]{escape(where)}{len(results.dropped)} stored result(s) of another run were not "
                "compared (listed under `dropped` in results.json and in the report)[/yellow]"
            )
        if codes[-1] == EXIT_GATE_FAILED:
            err.print(f"[red]{escape(where + '--fail-on-gate: ' + str(candidate_problem(results)))}[/red]")
    for model, results in runs.items():  # the answer last, as report.md has it: one line, never wrapped
        print((model + ": " if model else "") + verdict_line(results), file=sys.stderr)
    return next((c for c in (EXIT_SETUP_FAILED, EXIT_GATE_FAILED) if c in codes), EXIT_OK)


def announce_summary(results: Results) -> None:
    """The summary table; under recommend_by goodput each setup's tuned command, ready to paste."""
    from qeval.report.markdown import print_summary

    print_summary(results)
    if results.serving is not None:
        for row in results.serving.setups:
            print(f"{row.setup}: {row.serve_command}")
