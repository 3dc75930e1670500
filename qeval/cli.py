"""The `qeval` command line: run, validate, plan, report, compare, tasks, quantize, advise, schema (the stable
surface: docs/architecture.md §7)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qeval.analysis.recommend import candidate_problem
from qeval.errors import UserError

try:  # typer >= 0.20 runs on a click of its own; older ones on click itself
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_errors  # type: ignore[no-redef]

if TYPE_CHECKING:
    from qeval.config.workload import WorkloadSpec
    from qeval.memory.cluster import Cluster, ClusterRow
    from qeval.memory.planner import PlanRow
    from qeval.memory.workload_plan import WorkloadSource
    from qeval.results.schema import Results
    from qeval.results.serving import ServingResults
    from qeval.workload.stats import WorkloadStats
    from qeval.workload.trace import Trace

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Quantization quality-vs-memory evaluation.")
_err = Console(stderr=True)

#: `qeval run`'s exit codes (README "Guarantees")
EXIT_OK = 0  # every setup scored (and, under --fail-on-gate, the candidate passes every gate)
EXIT_SETUP_FAILED = 1  # a setup (the baseline included) failed: the comparison is incomplete
EXIT_BAD_INPUT = 2  # bad input, refused before any model loaded; nothing written
EXIT_GATE_FAILED = 3  # --fail-on-gate: every setup scored, but the candidate does not pass every gate
EXIT_NONE_MEETS_SLO = 3  # goodput: no setup recommended (none meets the SLO, or none was served)
EXIT_NOT_CHECKED = 4  # compare --fail-on-regression: no regression found, but not everything could be checked
EXIT_INTERRUPTED = 130  # Ctrl-C: rerun the same command to resume


def _fail(exc: UserError) -> None:
    print(f"qeval: error: {exc}", file=sys.stderr)
    raise typer.Exit(EXIT_BAD_INPUT)


def _split(value: str | None, option: str = "") -> list[str] | None:
    """A comma-separated option's names; None where it was not given. Given but naming nothing
    (`--setups ""`, `--setups ,`) is a UserError: an empty selection must not run everything."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UserError(
            f"{option} {value!r}: names nothing; give one or more names, comma-separated, or leave the option out"
        )
    return names


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="run config YAML")],
    output: Annotated[Path | None, typer.Option(help="run directory (default reports/<config name>)")] = None,
    setups: Annotated[str | None, typer.Option(help="comma-separated setups to run (the baseline always runs)")] = None,
    tasks: Annotated[str | None, typer.Option(help="comma-separated tasks to score")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="score only the first N samples of each task")] = None,
    force: Annotated[
        bool, typer.Option(help="recompute stored results; write into a folder holding another run")
    ] = False,
    fail_on_gate: Annotated[
        bool, typer.Option(help="exit 3 when the candidate does not pass every quality gate")
    ] = False,
    executor: Annotated[
        str | None,
        typer.Option(help="local or ray: where the setups run (overrides the config's executor.kind; docs/cluster.md)"),
    ] = None,
    performance: Annotated[
        bool | None,
        typer.Option(
            "--performance/--no-performance",
            help="time every setup after scoring, or skip that phase for this run (overrides the config's "
            "performance.enabled; docs/performance.md)",
        ),
    ] = None,
) -> None:
    """Serve the model under every setup of CONFIG, score the tasks, write RUN_DIR.

    Exit codes: 0 every setup scored; 1 a setup failed; 2 bad input (nothing ran);
    3 under --fail-on-gate, the candidate does not pass every gate; 130 interrupted."""
    from qeval.config import load_config
    from qeval.run.advice import AdviceFailed
    from qeval.run.runner import RunOptions
    from qeval.run.runner import run as run_all
    from qeval.sweep.config import load_sweep
    from qeval.sweep.run import model_dir, run_sweep

    try:
        if executor not in (None, "local", "ray"):
            raise UserError(f"--executor {executor}: expected local or ray")
        only_setups, only_tasks = _split(setups, "--setups"), _split(tasks, "--tasks")
        sweep = load_sweep(config)  # None: a config of one model
        if sweep is not None:
            out = output or Path("reports") / sweep.name
            runs = run_sweep(sweep, RunOptions(out, only_setups, only_tasks, limit, force, executor, performance))
            tracked = {m: (model_dir(out, m), c.tracking) for m, c in sweep.configs.items() if m in runs}
        else:
            cfg = load_config(config)
            out = output or Path("reports") / cfg.name
            opts = RunOptions(out, only_setups, only_tasks, limit, force, executor, performance)
            runs = {"": run_all(cfg, opts)}
            tracked = {"": (out, cfg.tracking)}
    except UserError as exc:
        _fail(exc)
        return
    except AdviceFailed as exc:  # the advise: block's process failed: nothing ran after it
        print(f"qeval: error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_SETUP_FAILED) from None
    except KeyboardInterrupt:
        print("qeval: interrupted; what was stored is kept: rerun the same command to resume", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except OSError as exc:  # a full disk, a read-only or immutable file, at the end of the work
        where = f" ({exc.filename})" if exc.filename else ""
        print(
            f"qeval: error: cannot write the run's files{where}: {exc.strerror or exc}; what was stored is kept: "
            "fix that and rerun the same command (stored results are not recomputed)",
            file=sys.stderr,
        )
        raise typer.Exit(EXIT_SETUP_FAILED) from None
    from qeval.report.markdown import verdict_line
    from qeval.tracking import track_run

    for model, (run_dir, tracking) in tracked.items():  # after the run's own files, which never wait on it
        track_run(run_dir, runs[model], tracking, where=f"{model}: " if model else "")
    _err.print(
        escape(
            f"{'sweep:   ' + str(out / 'sweep.json') if sweep else 'results: ' + str(out / 'results.json')}\n"
            f"report:  {out / 'report.md'}"
        )
    )
    codes = []
    for model, results in runs.items():  # a sweep: per model; exit 1 over 3 over 0, as for one model
        where = f"{model}: " if model else ""
        codes.append(exit_code(results, fail_on_gate))
        failed_setups = [s.name for s in results.setups if s.status != "ok"]
        if failed_setups:
            _err.print(
                f"[yellow]{escape(where)}setups that failed: {escape(', '.join(failed_setups))} "
                "(see results.json)[/yellow]"
            )
        if results.dropped:
            _err.print(
                f"[yellow]{escape(where)}{len(results.dropped)} stored result(s) of another run were not "
                "compared (listed under `dropped` in results.json and in the report)[/yellow]"
            )
        if codes[-1] == EXIT_GATE_FAILED:
            _err.print(f"[red]{escape(where + '--fail-on-gate: ' + str(candidate_problem(results)))}[/red]")
    for model, results in runs.items():  # the answer last, as report.md has it: one line, never wrapped
        print((model + ": " if model else "") + verdict_line(results), file=sys.stderr)
    raise typer.Exit(next((c for c in (EXIT_SETUP_FAILED, EXIT_GATE_FAILED) if c in codes), EXIT_OK))


def exit_code(results: Results, fail_on_gate: bool) -> int:
    """0, 1 or 3 for a run that finished (2 and 130 are decided before it finishes)."""
    if any(s.status != "ok" for s in results.setups):
        return EXIT_SETUP_FAILED
    if fail_on_gate and candidate_problem(results):
        return EXIT_GATE_FAILED
    return EXIT_OK


@app.command()
def validate(config: Annotated[Path, typer.Argument(help="run config YAML")]) -> None:
    """Check CONFIG, its tasks and data checksums, and every setup on this device; load no model."""
    from qeval.config import load_config
    from qeval.run.preflight import preflight
    from qeval.sweep.config import load_sweep

    try:
        sweep = load_sweep(config)
        plans = {m: preflight(c) for m, c in (sweep.configs if sweep else {"": load_config(config)}).items()}
    except UserError as exc:
        _fail(exc)
        return
    for model, plan in plans.items():
        where = f" model {model}" if model else ""
        dtype = f", {plan.precision.short}" if plan.precision else ""
        print(f"{config}{where}: ok ({len(plan.setups)} setups, {len(plan.tasks)} tasks, device {plan.device}{dtype})")


@app.command()
def quantize(
    config: Annotated[Path, typer.Argument(help="run config YAML")],
    setups: Annotated[
        str | None, typer.Option(help="comma-separated setups to quantize (default: all that need it)")
    ] = None,
    force: Annotated[bool, typer.Option(help="remake checkpoints that are already cached")] = False,
) -> None:
    """Make the checkpoints CONFIG's w8a8 / w4a8 / gptq / awq setups serve, on vllm or hf (llm-compressor)."""
    from qeval.config import load_config
    from qeval.quantize.pipeline import QuantizeFailed
    from qeval.quantize.pipeline import quantize as quantize_all

    try:
        made = quantize_all(load_config(config), only=_split(setups, "--setups"), force=force)
    except UserError as exc:
        _fail(exc)
        return
    except QuantizeFailed as exc:
        print(f"qeval: quantize failed: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    table = Table("setup", "scheme", "checkpoint", "status")
    for m in made:
        table.add_row(
            escape(m.setup),
            escape(m.scheme),
            escape(str(m.path)),
            "cached" if m.cached else f"made in {m.seconds:.0f} s",
        )
    Console().print(table)


@app.command()
def goodput(
    config: Annotated[Path, typer.Argument(help="run config YAML with workload: (and its slo:) and serving: blocks")],
    output: Annotated[Path | None, typer.Option(help="run directory (default reports/<config name>)")] = None,
    setups: Annotated[str | None, typer.Option(help="comma-separated setups to serve (default: all)")] = None,
    exhaustive: Annotated[
        bool,
        typer.Option(help="measure every level of the grid (no early stop): the tuner's pick is then compared offline"),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(help="measure every setup again (reuse no stored row); write into a folder holding another run"),
    ] = False,
) -> None:
    """Serve CONFIG's workload on each setup with `vllm serve`, tune max-num-seqs, recommend by goodput
    (RUN_DIR/serving.json, serving.md; docs/performance.md, "Serving the workload").

    Exit codes: 0 a setup is recommended and every setup was served; 1 a setup could not be
    served (the recommendation is among the others), or the files could not be written; 2 bad
    input or no vLLM to serve with (nothing served); 3 no setup recommended: none meets the SLO
    (and passes every gate of a scored run in RUN_DIR), or none could be served; 130 interrupted."""
    from qeval.backends.device import dtype_for, resolve_device
    from qeval.config import load_config
    from qeval.model.source import resolve_model
    from qeval.perf.serving import check_goodput, check_vllm, goodput_run
    from qeval.quantize.checkpoints import resolve_checkpoints
    from qeval.report.serving import write_report
    from qeval.run.rundir import take_run_dir
    from qeval.run.serving import scored_gates

    lock = None
    try:
        cfg = load_config(config)
        out = output or Path("reports") / cfg.name
        if cfg.workload is None or cfg.workload.slo is None or cfg.serving is None:
            raise UserError(f"{config}: qeval goodput needs a workload: block with an slo: and a serving: block")
        # the backend's blocks and the vLLM that will serve, before checkpoints are looked for
        # (`qeval quantize` first) and before anything loads
        check_goodput(cfg)
        check_vllm(cfg)
        serving = cfg.serving
        only = _split(setups, "--setups")
        if only is not None:
            unknown = sorted(set(only) - {s.name for s in cfg.setups})
            if unknown:
                raise UserError(f"--setups: {unknown[0]!r} is not a setup of {config}")
        # the run directory as `run` takes it (its owner, its lock: no `qeval run` writes beside)
        lock = take_run_dir(out, cfg.name, force, _goodput_files(out, cfg.name))
        # the dtype as `qeval quantize` resolved it: part of a checkpoint's key
        dtype = dtype_for(cfg.model.dtype, Path(cfg.model.path), resolve_device(cfg.device))
        asked = cfg.for_engine(dtype)  # the config as a scored run records it: its results.json is matched on it
        if only is not None:
            cfg = cfg.model_copy(update={"setups": [s for s in cfg.setups if s.name in only]})
        if exhaustive:
            cfg = cfg.model_copy(update={"serving": serving.model_copy(update={"exhaustive": True})})
        cfg = cfg.for_engine(dtype)  # goodput's engines and serving.json: the resolved dtype, as before
        source = resolve_model(cfg.model.path, cfg.model.revision)
        cfg = resolve_checkpoints(cfg, source.checksum, {s.name for s in cfg.setups}, dtype)
        checkpoints = {
            s.name: resolve_model(s.checkpoint, s.checkpoint_revision).checksum for s in cfg.setups if s.checkpoint
        }  # as preflight keys the scores: the served content, not its path
        gated, unused = scored_gates(out, asked, source.checksum)
        if unused:
            print(f"qeval: {unused}", file=sys.stderr)
        results = goodput_run(cfg, out, gated, model_sha256=source.checksum, checkpoint_sha256=checkpoints, force=force)
        report = write_report(results, out)
    except UserError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        print("qeval: interrupted; the setups served are kept in serving.json: rerun to resume", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except OSError as exc:  # a full disk, a read-only file: serving.json or the report
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"qeval: error: cannot write the serving files{where}: {exc.strerror or exc}", file=sys.stderr)
        raise typer.Exit(EXIT_SETUP_FAILED) from None
    finally:
        if lock is not None:
            lock.release()
    print(f"recommended (by goodput): {results.recommendation.get('setup') or 'none'}")
    for reason in (results.recommendation.get("reasons") or {}).values():
        print(f"  {reason}")
    for r in results.setups:
        print(f"{r.setup}: {r.serve_command}")
    print(f"report: {report}")
    code = goodput_exit_code(results)
    if code == EXIT_NONE_MEETS_SLO:
        if all(r.status != "ok" for r in results.setups):
            why = "no setup could be served (see serving.json)"
        else:
            gates = " and passes every gate" if results.recommendation.get("gates_checked") else ""
            why = f"no setup meets the SLO{gates} (serving.md says why)"
        print(f"qeval: goodput: {why}", file=sys.stderr)
    elif code == EXIT_SETUP_FAILED:
        failed = ", ".join(r.setup for r in results.setups if r.status != "ok")
        print(f"qeval: goodput: setups that could not be served: {failed} (see serving.json)", file=sys.stderr)
    raise typer.Exit(code)


def _goodput_files(out: Path, name: str) -> frozenset[str]:
    """`qeval goodput`'s own files in `out` where its serving.json is of config `name`: written
    before goodput took the run directory as `run` does (no marker), they are this config's."""
    import json

    from qeval.report.serving import FIGURES
    from qeval.results.serving import FILE

    try:
        if json.loads((out / FILE).read_text(encoding="utf-8")).get("config") != name:
            return frozenset()
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset({FILE, "serving.md", "serving", *FIGURES})


def goodput_exit_code(results: ServingResults) -> int:
    """`qeval goodput`'s exit code for a finished run (2 and 130 are decided before it finishes):
    3 with no recommendation (no setup meets the SLO, or none was served), else 1 when a setup
    could not be served, else 0."""
    if not results.recommendation.get("setup"):
        return EXIT_NONE_MEETS_SLO
    if any(r.status != "ok" for r in results.setups):
        return EXIT_SETUP_FAILED
    return EXIT_OK


@app.command()
def advise(
    config: Annotated[Path, typer.Argument(help="run config YAML")],
    budget: Annotated[
        str | None,
        typer.Option(help="average bits per decoder-linear weight (4.5bpw) or memory at the budget's context (350MiB)"),
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="the setup to lower (default: the config's first int4, else int8, quanto setup)")
    ] = None,
    text: Annotated[
        Path | None,
        typer.Option(
            help="calibration text: plain text (paragraphs) or JSON Lines with `text` (default: the perplexity task)"
        ),
    ] = None,
    calib_docs: Annotated[
        int | None, typer.Option(help="documents the sensitivity is measured on [default: 16]")
    ] = None,
    heldout_docs: Annotated[
        int | None, typer.Option(help="further documents the mix is checked on [default: 32]")
    ] = None,
    random_draws: Annotated[
        int | None, typer.Option(help="random mixes of the same bytes to compare with [default: 5]")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the random mixes [default: 0]")] = None,
    unions: Annotated[
        bool | None,
        typer.Option(
            "--unions/--no-unions",
            help="also measure whole blocks and module types, not only the layer x type cells [default: unions]",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="advice.md to write (.html and .json beside it); default reports/<config name>/advice.md"),
    ] = None,
) -> None:
    """Which layers to keep at the model's dtype: per-unit sensitivity, a search under the budget,
    and the advised setup with its `keep:` list (docs/advisor.md). A config with an `advise:`
    block gives the defaults of every option (--budget included); an option given overrides it."""
    from qeval.advise.advisor import Options
    from qeval.advise.advisor import advise as run_advisor
    from qeval.advise.output import check_advice_output, setup_snippet, write
    from qeval.advise.search import parse_budget
    from qeval.config import load_config
    from qeval.config.advise import AdviseSpec
    from qeval.run.runner import check_output
    from qeval.strict import SEED_MAX

    try:
        cfg = load_config(config)
        block = cfg.advise or AdviseSpec(budget="1bpw")  # a stand-in for the defaults; its budget is never used
        if budget is None and cfg.advise is None:
            raise UserError("--budget is required: e.g. --budget 4.5bpw or --budget 350MiB")
        calib = block.calib_docs if calib_docs is None else calib_docs
        heldout = block.heldout_docs if heldout_docs is None else heldout_docs
        draws = block.random_draws if random_draws is None else random_draws
        if calib < 1 or heldout < 0 or draws < 0:
            raise UserError("--calib-docs must be at least 1, --heldout-docs and --random-draws at least 0")
        if heldout == 1:
            raise UserError("--heldout-docs 1: a paired interval needs at least 2 documents (or 0 for none)")
        if seed is not None and not 0 <= seed <= SEED_MAX:
            raise UserError(f"--seed {seed}: expected 0 to {SEED_MAX} (what numpy, torch and Python all take)")
        advice_path = output or Path("reports") / cfg.name / "advice.md"
        check_advice_output(advice_path)  # before the work: a path it cannot write would lose all of it
        check_output(advice_path, Path(cfg.model.path) if Path(cfg.model.path).is_dir() else None)
        cal_text = text if text is not None else (Path(block.text) if block.text else None)
        opts = Options(
            parse_budget(budget) if budget is not None else block.parsed_budget(),
            target if target is not None else block.target,
            cal_text,
            calib,
            heldout,
            draws,
            block.seed if seed is None else seed,
            block.unions if unions is None else unions,
            block.name if cfg.advise else None,
        )
        advice = run_advisor(cfg, config, opts, log=lambda m: print(m, file=sys.stderr))
    except UserError as exc:
        _fail(exc)
        return
    try:
        paths = write(advice, advice_path)
    except OSError as exc:  # a full disk, or the folder changed under the work: one line, exit 1
        print(
            f"qeval: error: cannot write the advice ({exc.filename or advice_path}): {exc.strerror or exc}",
            file=sys.stderr,
        )
        raise typer.Exit(EXIT_SETUP_FAILED) from None
    print(setup_snippet(advice), end="")
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="a finished run directory")]) -> None:
    """Regenerate report.md and report.html from RUN_DIR/results.json (byte-for-byte); for a
    sweep, every model's and the sweep's report.md from sweep.json."""
    from qeval.report.write import write_report
    from qeval.results.schema import read_results
    from qeval.tasks.kinds import report_sections

    try:
        if (run_dir / "sweep.json").is_file():  # a sweep: each model's report, then the sweep's
            from qeval.sweep.report import write_sweep_report
            from qeval.sweep.schema import model_run_dir, read_sweep

            for m in read_sweep(run_dir / "sweep.json").models:
                write_report(
                    model_run_dir(run_dir, m),
                    read_results(model_run_dir(run_dir, m) / "results.json"),
                    report_sections(),
                )
            print(write_sweep_report(run_dir, report_sections()))
            return
        md, html = write_report(run_dir, read_results(run_dir / "results.json"), report_sections())
    except UserError as exc:
        _fail(exc)
        return
    print(f"{md}\n{html}")


@app.command("compare")
def compare_cmd(
    runs: Annotated[list[Path], typer.Argument(help="finished run directories; the first is the reference")],
    output: Annotated[Path, typer.Option(help="folder for compare.md, compare.html and compare.json")] = Path(
        "reports/compare"
    ),
    fail_on_regression: Annotated[
        float | None,
        typer.Option(
            help="exit 3 when a setup got worse than in the first run by more than MARGIN (in the metric's units: 0.02 "
            "is 2 points of accuracy) with 95% confidence; exit 4 when a setup or task of the first run could "
            "not be checked"
        ),
    ] = None,
) -> None:
    """Compare the same setups across runs: paired by document where the runs scored the same
    data, unpaired (and said so) where not; what changed between them; each setup's key metric
    over the runs.

    Exit codes: 0 compared; 2 bad input; under --fail-on-regression, 3 a setup got worse, 4 none
    found but a setup or task of the first run could not be checked."""
    from qeval.compare import compare_runs, write_comparison

    try:
        if fail_on_regression is not None and not (math.isfinite(fail_on_regression) and fail_on_regression >= 0):
            raise UserError(
                f"--fail-on-regression {fail_on_regression}: expected a finite number >= 0, in the "
                "compared metric's units (0.02: 2 points of accuracy)"
            )
        comparison = compare_runs(runs, fail_on_regression)
        md, html, js = write_comparison(output, comparison)
    except UserError as exc:
        _fail(exc)
        return
    print(f"{md}\n{html}\n{js}")
    gated = fail_on_regression is not None
    for line in comparison.unchecked():
        print(f"qeval: {'not checked' if gated else 'warning: not checked'}: {line}", file=sys.stderr)
    if gated:
        for line in comparison.regressions():
            print(f"qeval: regression: {line}", file=sys.stderr)
        gate = comparison.gate()
        if gate == "regression":
            raise typer.Exit(EXIT_GATE_FAILED)
        if gate == "unchecked":
            print(
                f"no regression beyond {fail_on_regression:g} found, but {len(comparison.unchecked())} setup(s) or "
                "task(s) of the reference run could not be checked: the gate fails",
                file=sys.stderr,
            )
            raise typer.Exit(EXIT_NOT_CHECKED)
        open_ = comparison.inconclusive()
        if open_:  # the gate passes (it fails on "worse"), but these intervals do not rule a regression out
            more = f" and {len(open_) - 5} more" if len(open_) > 5 else ""
            print(
                f"no regression beyond {fail_on_regression:g} found, but none ruled out on {len(open_)} "
                f"comparison(s) whose 95% interval reaches past the margin (inconclusive): "
                f"{'; '.join(open_[:5])}{more}",
                file=sys.stderr,
            )
        else:
            print(f"no regression beyond {fail_on_regression:g}", file=sys.stderr)


@app.command("tasks")
def list_tasks(
    tasks_dir: Annotated[Path, typer.Option(help="folder of qeval task YAMLs")] = Path("tasks"),
    lm_eval: Annotated[
        list[Path] | None,
        typer.Option(
            help="folders of lm-eval task YAMLs (lm_eval.include_path); default: tasks/lm_eval and tasks/lm_eval_full"
        ),
    ] = None,
    library: Annotated[bool, typer.Option(help="also list lm-eval's own task library (its index takes ~10 s)")] = False,
) -> None:
    """List qeval's tasks (kind, samples, data checksum), the lm-eval tasks and groups of the
    include folders, the suites, and with --library lm-eval's own tasks."""
    from qeval.config.lm_eval import SUITES
    from qeval.tasks import available_tasks, load_task
    from qeval.tasks.lm_eval.yamls import local_names

    try:
        table = Table("task", "kind", "samples", "sha256 / source")
        for name in available_tasks(tasks_dir):
            t = load_task(name, tasks_dir)
            table.add_row(escape(name), escape(t.spec.output_type), str(len(t.docs)), t.sha256[:16] + "…")
        # the fixtures, and the full sets where `make lm-eval-full` wrote them
        folders = (
            lm_eval
            if lm_eval is not None
            else [p for p in [tasks_dir / "lm_eval", tasks_dir / "lm_eval_full"] if p.is_dir()]
        )
        for folder in folders:
            for name, (kind, path) in local_names(folder).items():
                table.add_row(escape(name), f"lm-eval {kind}", "", escape(str(path)))
        for suite, members in SUITES.items():
            table.add_row(suite, "suite", "", escape(", ".join(f"{t.name} ({t.num_fewshot}-shot)" for t in members)))
    except UserError as exc:
        _fail(exc)
        return
    Console().print(table)
    if library:
        from lm_eval.tasks import TaskManager

        manager = TaskManager()
        print(
            f"lm-eval's library: {len(manager.all_subtasks)} tasks, {len(manager.all_groups)} groups, e.g. "
            + ", ".join(sorted(manager.all_groups)[:20])
            + " …"
        )


@app.command("plan")
def plan_cmd(
    model: Annotated[
        str | None,
        typer.Option(
            help="model folder, config.json path, GGUF file, or hub id (default "
            "with --workload CONFIG: the config's model)"
        ),
    ] = None,
    gpu_gib: Annotated[
        float | None, typer.Option(min=0.001, help="GPU memory in GiB [default: 24, or a --workload config's budget]")
    ] = None,
    utilization: Annotated[
        float | None, typer.Option(min=0.01, max=1.0, help="share of GPU memory the engine may use [default: 0.9]")
    ] = None,
    context_len: Annotated[
        int | None, typer.Option(min=1, help="tokens per sequence [default: 4096; with --workload: max-model-len]")
    ] = None,
    margin: Annotated[
        float | None,
        typer.Option(
            min=0.0, max=0.9, help="share of the KV pool lost to fragmentation (budget.margin) [default: 0.05]"
        ),
    ] = None,
    overhead_gib: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="runtime overhead inside the budget: "
            "activations, workspaces, CUDA context (budget.overhead_gib) "
            "[default: 1]",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    gpus_per_node: Annotated[
        int | None, typer.Option(min=1, help="cluster view: GPUs per node (of --gpu-gib each; docs/cluster.md)")
    ] = None,
    nodes: Annotated[int | None, typer.Option(min=1, help="cluster view: nodes (default 1)")] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="cluster view: sequences of --context-len each setup must hold (default 1)"),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="whose accounting of the KV cache: vllm (block rounding, the "
            "hybrid allocator's groups) or hf (transformers' cache layers)"
        ),
    ] = "vllm",
    block_size: Annotated[int, typer.Option(min=1, help="vLLM's KV block size in tokens (16 on a GPU)")] = 16,
    max_num_batched_tokens: Annotated[
        int, typer.Option(min=1, help="vLLM's tokens in flight: sliding-window and chunked layers keep room for them")
    ] = 2048,
    workload: Annotated[
        Path | None,
        typer.Option(
            help="a trace (JSON Lines, ShareGPT JSON) or a YAML with a "
            "workload: block: max-model-len from its lengths, the share it "
            "refuses, KV blocks per request, prefix sharing "
            "(docs/performance.md)"
        ),
    ] = None,
    percentile: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            max=100.0,
            help="with --workload: max-model-len's "
            "percentile of prompt + output [default: 99, or the block's "
            "max_model_len_percentile]",
        ),
    ] = None,
    workload_format: Annotated[
        str | None, typer.Option(help="a trace file's format: auto, qeval, sharegpt or vllm-custom [default: auto]")
    ] = None,
    custom_output_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="output tokens of each request of a vllm-custom trace (vLLM's --custom-output-len) [default: 256]",
        ),
    ] = None,
) -> None:
    """Predict weights, KV cache per token, KV tokens that fit and concurrent sequences per setup;
    with --gpus-per-node, also the GPUs each setup needs on a cluster and how many run at once;
    with --workload, max-model-len from the workload's lengths and the concurrency they allow."""
    import json

    from qeval.memory.capacity import Budget
    from qeval.memory.cluster import Cluster, cluster_json, cluster_plan
    from qeval.memory.layouts import VllmCache
    from qeval.memory.planner import load_model_config, plan, plan_json

    try:
        _check_plan_options(
            **{
                k: v
                for k, v in (
                    ("gpu_gib", gpu_gib),
                    ("utilization", utilization),
                    ("margin", margin),
                    ("overhead_gib", overhead_gib),
                    ("percentile", percentile),
                )
                if v is not None
            }
        )
        if gpus_per_node is None and (nodes is not None or concurrency is not None):
            raise UserError(
                f"{'--nodes' if nodes is not None else '--concurrency'} applies to the cluster view: "
                "give --gpus-per-node too"
            )
        if workload is None and (percentile, workload_format, custom_output_len) != (None, None, None):
            raise UserError("--percentile, --workload-format and --custom-output-len apply to --workload: give it too")
        if workload is not None and context_len is not None:
            raise UserError("--context-len and --workload: the workload's max-model-len is the context")
        nodes, concurrency = nodes or 1, concurrency or 1
        source = _workload_source(workload, workload_format, custom_output_len) if workload else None
        run_cfg = source.run if source else None
        model = model or (run_cfg.model.path if run_cfg else None)
        if model is None:
            raise UserError("--model is required (or --workload with a run config, whose model is planned)")
        given = {
            "gpu_memory_gib": gpu_gib,
            "utilization": utilization,
            "context_len": context_len,
            "overhead_gib": overhead_gib,
            "margin": margin,
        }
        budget = Budget(
            **(
                (run_cfg.budget if run_cfg else Budget()).model_dump()
                | {k: v for k, v in given.items() if v is not None}
            )
        )
        if engine not in ("vllm", "hf"):
            raise UserError(f"--engine {engine}: expected vllm or hf")
        vllm = VllmCache(
            block_size=block_size, in_flight_tokens=max_num_batched_tokens, state_pages=2, kernel_block=block_size
        )
        config = load_model_config(model)
        planned = _plan_workload(source, model, config, percentile, block_size) if source else None
        if planned:
            budget = Budget(**(budget.model_dump() | {"context_len": planned[0].max_model_len}))
        context_len = budget.context_len
        rows = plan(config, budget, engine=engine, vllm=vllm)  # type: ignore[arg-type]  # checked above
        cluster = Cluster(nodes, gpus_per_node) if gpus_per_node else None
        grouped = (
            cluster_plan(
                config,
                budget,
                cluster,
                concurrency,
                engine=engine,  # type: ignore[arg-type]
                vllm=vllm,
            )
            if cluster
            else None
        )
    except UserError as exc:
        _fail(exc)
        return
    gpu_gib = budget.gpu_memory_gib
    if as_json:
        out = plan_json(rows)
        if cluster and grouped:
            out["cluster"] = cluster_json(*grouped, cluster, gpu_gib, concurrency)
        if planned and source:
            out["workload"] = _workload_json(planned, rows, source.spec)
        print(json.dumps(out, indent=2))
        return
    title = escape(f"{model} on {gpu_gib:g} GiB x {budget.utilization:g} ({engine})")
    table = Table(
        "setup",
        "weights",
        "KV / token",
        f"KV / sequence @ {context_len}",
        "KV tokens",
        f"sequences @ {context_len}",
        title=title,
    )
    for r in rows:
        table.add_row(
            escape(r.setup),
            f"{r.weights_bytes / 2**30:.2f} GiB",
            f"{r.kv_bytes_per_token / 1024:.1f} KiB",
            _mib(r.kv_bytes_per_sequence),
            f"{r.kv_cache_tokens:,}",
            f"{math.floor(r.max_concurrency):,}" + ("" if r.fits else " (does not fit)"),
        )
    Console().print(table)
    first = rows[0]
    if set(first.kv_by_layer_type) != {"full"} or first.state_bytes_per_sequence:
        parts = [f"{kind} {_mib(b)}" for kind, b in first.kv_by_layer_type.items()]
        parts += [f"state {_mib(first.state_bytes_per_sequence)}"] if first.state_bytes_per_sequence else []
        Console().print(
            escape(
                f"{first.setup}: one {context_len}-token sequence holds {', '.join(parts)} "
                f"({engine}), against {_mib(first.naive_kv_bytes_per_sequence)} if every layer "
                "cached every token; KV / token counts the attention layers only, below the "
                "shortest window or chunk"
            )
        )
    if cluster and grouped:
        _print_cluster(model, cluster, gpu_gib, context_len, concurrency, *grouped)
    if planned and source:
        _print_workload(planned, rows, source.spec)


def _workload_source(path: Path, fmt: str | None, custom_output_len: int | None) -> WorkloadSource:
    from qeval.memory.workload_plan import workload_source

    return workload_source(path, fmt, custom_output_len)


def _plan_workload(
    source: WorkloadSource, model: str, config: dict[str, Any], percentile: float | None, block_size: int
) -> tuple[WorkloadStats, Trace]:
    """The workload's requests, checked against the model's context (a run config's
    model.max_context, else config.json's), and their plan at the percentile and block size."""
    from qeval.memory.workload_plan import model_context, tokenizer_source
    from qeval.workload.draw import requests_of
    from qeval.workload.stats import summarize
    from qeval.workload.tokens import TokenCounter

    run = source.run
    own = run is not None and run.model.path == model  # --model names another model: its own context
    context = run.model.max_context if run is not None and own else model_context(config)
    tok, why = tokenizer_source(model)
    counter = TokenCounter(
        tok, run.model.trust_remote_code if run and own else False, run.model.revision if run and own else None, why
    )
    trace = requests_of(source.spec, counter, context)
    return summarize(trace, percentile or source.spec.max_model_len_percentile, block_size, context), trace


def _workload_json(planned: tuple[WorkloadStats, Trace], rows: list[PlanRow], spec: WorkloadSpec) -> dict[str, Any]:
    from qeval.memory.workload_plan import serving_rows, workload_json

    stats, trace = planned
    slo = spec.slo.model_dump() if spec.slo else None
    return workload_json(
        stats, serving_rows(rows, stats), trace.source, trace.format, trace.skipped, trace.arrivals, slo
    )


def _print_workload(planned: tuple[WorkloadStats, Trace], rows: list[PlanRow], spec: WorkloadSpec) -> None:
    """The workload's lengths, max-model-len and what it refuses, blocks, sharing, and each setup's
    concurrency on the distribution beside the worst case."""
    from qeval.memory.workload_plan import serving_rows

    stats, trace = planned
    out = Console()
    skipped = f", {trace.skipped} entries skipped (no prompt-answer pair)" if trace.skipped else ""
    out.print(
        escape(
            f"workload: {trace.source} ({trace.format}), {stats.requests:,} requests{skipped}; "
            f"arrivals: {trace.arrivals}"
        )
    )
    lengths = Table("tokens", "p50", "p90", "p95", "p99", "max", "mean", title="request lengths")
    for name, ls in (("prompt", stats.prompt), ("output", stats.output), ("prompt + output", stats.total)):
        lengths.add_row(name, *(f"{v:,}" for v in (ls.p50, ls.p90, ls.p95, ls.p99, ls.max)), f"{ls.mean:,.1f}")
    out.print(lengths)
    p = f"p{stats.percentile:g}"
    out.print(
        escape(
            f"max-model-len {stats.max_model_len:,}: {p} of prompt + output ({stats.percentile_tokens:,} "
            f"tokens) rounded up to whole {stats.block_size}-token KV blocks; it refuses {stats.refused:,} "
            f"of {stats.requests:,} requests ({stats.refused_share:.1%})"
        )
    )
    b = stats.blocks
    out.print(
        escape(
            f"KV blocks per admitted request (paged attention, ceil(tokens / {stats.block_size})): mean "
            f"{b.mean:g}, {p} {b.at_percentile:,}, max {b.max:,}, against "
            f"{-(-stats.max_model_len // stats.block_size):,} at max-model-len"
        )
    )
    if stats.prefix:
        x = stats.prefix
        out.print(
            escape(
                f"prefix caching: {x.groups:,} shared-prefix group(s), {x.requests_sharing:,} request(s) "
                f"reuse a prefix: {x.blocks_saved:,} blocks saved ({x.share_saved:.1%} of the blocks), mean "
                f"{x.mean_blocks_with_cache:g} blocks per request"
            )
        )
    serving = serving_rows(rows, stats)
    table = Table(
        "setup",
        "KV pool (blocks)",
        f"worst case @ {stats.max_model_len:,}",
        "distribution (mean)",
        f"at {p}",
        "with prefix cache",
        title="concurrent requests the KV pool holds",
    )
    for r in serving:
        cached = f"{r.concurrency_with_prefix_cache:,.1f}" if r.concurrency_with_prefix_cache is not None else "-"
        table.add_row(
            escape(r.setup),
            f"{r.pool_blocks:,}",
            f"{r.worst_case_concurrency:,.1f}",
            f"{r.concurrency_mean:,.1f}",
            f"{r.concurrency_at_percentile:,.1f}",
            cached,
        )
    out.print(table)
    if spec.slo:
        from qeval.perf.slo import ms

        targets = ", ".join(f"{k.removesuffix('_ms')} {ms(v)} ms" for k, v in spec.slo.targets().items())
        out.print(
            escape(
                f"SLO at p{spec.slo.percentile:g}: {targets} (the plan sizes memory only; `qeval goodput` serves "
                "this workload against it with `vllm serve`, as does `qeval run` with recommend_by: goodput)"
            )
        )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _check_plan_options(**values: float) -> None:
    """Click's ranges let inf and nan through (every comparison with nan is false)."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise UserError(f"--{name.replace('_', '-')} {value}: expected a finite number")


def _print_cluster(
    model: str,
    cluster: Cluster,
    gpu_gib: float,
    context_len: int,
    concurrency: int,
    rows: list[ClusterRow],
    at_once: int,
) -> None:
    table = Table(
        "setup",
        "GPUs (TP x PP)",
        "KV tokens",
        f"sequences @ {context_len}",
        "copies at once",
        title=escape(
            f"{model} on {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs of {gpu_gib:g} "
            f"GiB, {concurrency} sequence(s) each"
        ),
    )
    for r in rows:
        if r.gpus is None:
            table.add_row(escape(r.setup), "does not fit", "", "", "0")
            continue
        table.add_row(
            escape(r.setup),
            f"{r.gpus} ({r.tensor_parallel_size} x {r.pipeline_parallel_size})",
            f"{r.kv_cache_tokens:,}",
            f"{math.floor(r.max_concurrency):,}",
            str(r.copies_at_once),
        )
    Console().print(table)
    Console().print(f"all {len(rows)} setups side by side: {at_once} run at once on this cluster")


@app.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of results.json (docs/results.schema.json is this output)."""
    import json

    from qeval.results.schema import json_schema

    print(json.dumps(json_schema(), indent=2))


def main() -> None:
    """The `qeval` entry point. Click's usage errors (an unknown option, `--limit abc`, a missing
    argument) end in one line and exit 2, as every other bad input does, not in Typer's box."""
    try:
        code = app(standalone_mode=False)
    except _click_errors.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `qeval` alone: the help, as Typer shows it
            help_text = exc.format_message()  # empty where Typer's rich help printed itself
            if help_text:
                print(help_text, file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        print(f"qeval: error: {' '.join(exc.format_message().split())}{hint}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except _click_errors.ClickException as exc:  # e.g. a file option that cannot be opened
        print(f"qeval: error: {' '.join(exc.format_message().split())}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:  # EOF at a prompt: click's own word for it
        print("Aborted!", file=sys.stderr)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else EXIT_OK)


if __name__ == "__main__":
    main()
