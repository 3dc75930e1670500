"""The `qeval` command line: run, validate, plan, report, compare, tasks, quantize, advise, schema (the stable
surface: docs/architecture.md §7)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qeval.errors import UserError
from qeval.run.advise_command import (
    AdviceOutputOpt,
    BudgetOpt,
    CalibDocsOpt,
    HeldoutDocsOpt,
    KlTargetOpt,
    RandomDrawsOpt,
    TargetOpt,
    TextOpt,
    UnionsOpt,
)
from qeval.run.exits import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SETUP_FAILED,
    finished,
)

try:  # typer >= 0.20 runs on a click of its own; older ones on click itself
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_errors  # type: ignore[no-redef]

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Quantization quality-vs-memory evaluation.")
_err = Console(stderr=True)


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


# the longer options of `run` and `plan`, named here so that each signature stays a list of names (`advise`'s
# live with its command: qeval/run/advise_command.py)
RunForceOpt = Annotated[bool, typer.Option(help="recompute stored results; write into a folder holding another run")]
FailOnGateOpt = Annotated[bool, typer.Option(help="exit 3 when the candidate does not pass every quality gate")]
ExecutorOpt = Annotated[
    str | None,
    typer.Option(help="local or ray: where the setups run (overrides the config's executor.kind; docs/cluster.md)"),
]
PerformanceOpt = Annotated[
    bool | None,
    typer.Option(
        "--performance/--no-performance",
        help="time every setup after scoring, or skip that phase for this run (overrides the config's "
        "performance.enabled; docs/performance.md)",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="model folder, config.json path, GGUF file, or hub id (default with --workload CONFIG: the config's model)"
    ),
]
GpuGibOpt = Annotated[
    float | None, typer.Option(min=0.001, help="GPU memory in GiB [default: 24, or a --workload config's budget]")
]
UtilizationOpt = Annotated[
    float | None, typer.Option(min=0.01, max=1.0, help="share of GPU memory the engine may use [default: 0.9]")
]
ContextLenOpt = Annotated[
    int | None, typer.Option(min=1, help="tokens per sequence [default: 4096; with --workload: max-model-len]")
]
MarginOpt = Annotated[
    float | None,
    typer.Option(min=0.0, max=0.9, help="share of the KV pool lost to fragmentation (budget.margin) [default: 0.05]"),
]
_OVERHEAD_HELP = (
    "runtime overhead inside the budget: activations, workspaces, CUDA context (budget.overhead_gib) [default: 1]"
)
OverheadGibOpt = Annotated[float | None, typer.Option(min=0.0, help=_OVERHEAD_HELP)]
GpusPerNodeOpt = Annotated[
    int | None, typer.Option(min=1, help="cluster view: GPUs per node (of --gpu-gib each; docs/cluster.md)")
]
ConcurrencyOpt = Annotated[
    int | None, typer.Option(min=1, help="cluster view: sequences of --context-len each setup must hold (default 1)")
]
PlacementOpt = Annotated[
    bool, typer.Option(help="also where each setup runs on vLLM by device class (docs/backends.md)")
]
EngineOpt = Annotated[
    str,
    typer.Option(
        help="whose accounting of the KV cache: vllm (block rounding, the hybrid allocator's groups) or hf "
        "(transformers' cache layers)"
    ),
]
MaxBatchedOpt = Annotated[
    int, typer.Option(min=1, help="vLLM's tokens in flight: sliding-window and chunked layers keep room for them")
]
WorkloadOpt = Annotated[
    Path | None,
    typer.Option(
        help="a trace (JSON Lines, ShareGPT JSON) or a YAML with a workload: block: max-model-len from its lengths, "
        "the share it refuses, KV blocks per request, prefix sharing (docs/performance.md)"
    ),
]
_PERCENTILE_HELP = (
    "with --workload: max-model-len's percentile of prompt + output [default: 99, or the block's "
    "max_model_len_percentile]"
)
PercentileOpt = Annotated[float | None, typer.Option(min=0.001, max=100.0, help=_PERCENTILE_HELP)]
WorkloadFormatOpt = Annotated[
    str | None, typer.Option(help="a trace file's format: auto, qeval, sharegpt or vllm-custom [default: auto]")
]
CustomOutputLenOpt = Annotated[
    int | None,
    typer.Option(
        min=1, help="output tokens of each request of a vllm-custom trace (vLLM's --custom-output-len) [default: 256]"
    ),
]


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="run config YAML")],
    output: Annotated[Path | None, typer.Option(help="run directory (default reports/<config name>)")] = None,
    setups: Annotated[str | None, typer.Option(help="comma-separated setups to run (the baseline always runs)")] = None,
    tasks: Annotated[str | None, typer.Option(help="comma-separated tasks to score")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="score only the first N samples of each task")] = None,
    force: RunForceOpt = False,
    fail_on_gate: FailOnGateOpt = False,
    executor: ExecutorOpt = None,
    performance: PerformanceOpt = None,
) -> None:
    """Serve the model under every setup of CONFIG, score the tasks, write RUN_DIR.

    Exit codes: 0 every setup scored; 1 a setup failed; 2 bad input (nothing ran);
    3 under --fail-on-gate, the candidate does not pass every gate; 130 interrupted."""
    from qeval.run.advice import AdviceFailed
    from qeval.run.options import RunOptions
    from qeval.sweep.run import run_config

    try:
        if executor not in (None, "local", "ray"):
            raise UserError(f"--executor {executor}: expected local or ray")
        only_setups, only_tasks = _split(setups, "--setups"), _split(tasks, "--tasks")
        opts = RunOptions(Path(), only_setups, only_tasks, limit, force, executor, performance)
        ran = run_config(config, output, opts)
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
    from qeval.tracking import track_run

    for model, (run_dir, tracking) in ran.tracked.items():  # after the run's own files, which never wait on it
        track_run(run_dir, ran.runs[model], tracking, where=f"{model}: " if model else "")
    raise typer.Exit(finished(ran.runs, ran.out, ran.sweep, fail_on_gate))


@app.command()
def validate(
    config: Annotated[Path, typer.Argument(help="run config YAML")],
    placement: PlacementOpt = False,
) -> None:
    """Check CONFIG, its tasks and data checksums, and every setup on this device; load no model."""
    from qeval.backends import backend_entry
    from qeval.config import load_config
    from qeval.run.preflight import preflight
    from qeval.sweep.config import load_sweep

    try:
        sweep = load_sweep(config)
        configs = sweep.configs if sweep else {"": load_config(config)}
        lines = backend_entry("vllm").placement_lines
        if placement and lines is not None:  # the config's setups alone: before anything this machine lacks
            print("\n".join(lines(next(iter(configs.values())).setups)).lstrip("\n"))
        plans = {m: preflight(c) for m, c in configs.items()}
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
    """Make the llm-compressor checkpoints CONFIG's setups serve (INT8, INT4, FP8, FP4 methods), on vllm or hf."""
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
    from qeval.run.goodput import GoodputRequest, announce
    from qeval.run.goodput import goodput as serve_and_tune

    try:
        only = _split(setups, "--setups")
        request = GoodputRequest(config, output, only, exhaustive, force)
        results, report = serve_and_tune(request)
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
    raise typer.Exit(announce(results, report))


@app.command()
def advise(
    config: Annotated[Path, typer.Argument(help="run config YAML")],
    budget: BudgetOpt = None,
    target: TargetOpt = None,
    text: TextOpt = None,
    calib_docs: CalibDocsOpt = None,
    heldout_docs: HeldoutDocsOpt = None,
    random_draws: RandomDrawsOpt = None,
    seed: Annotated[int | None, typer.Option(help="seed of the random mixes [default: 0]")] = None,
    unions: UnionsOpt = None,
    output: AdviceOutputOpt = None,
    kl_target: KlTargetOpt = None,
) -> None:
    """Which layers to keep at the model's dtype: per-unit sensitivity, a search under the budget,
    and the advised setup with its `keep:` list (docs/advisor.md); with --kl-target, which layers'
    KV cache to keep (`kv_keep:`). A config with an `advise:` block gives the defaults of every
    option (--budget included); an option given overrides it."""
    from qeval.advise.advisor import advise as run_advisor
    from qeval.advise.output import setup_snippet, write
    from qeval.run.advise_command import AdviseRequest, advise_plan

    request = AdviseRequest(
        config, budget, target, text, calib_docs, heldout_docs, random_draws, seed, unions, output, kl_target
    )
    try:
        cfg, opts, advice_path = advise_plan(request)
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
    from qeval.sweep.report import regenerate

    try:
        written = regenerate(run_dir)
    except UserError as exc:
        _fail(exc)
        return
    print("\n".join(str(p) for p in written))


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
    from qeval.compare.gate import check_margin, regression_exit

    try:
        check_margin(fail_on_regression)
        comparison = compare_runs(runs, fail_on_regression)
        md, html, js = write_comparison(output, comparison)
    except UserError as exc:
        _fail(exc)
        return
    print(f"{md}\n{html}\n{js}")
    raise typer.Exit(regression_exit(comparison, fail_on_regression))


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
    from qeval.tasks.listing import library_line, task_table

    try:
        table = task_table(tasks_dir, lm_eval)
    except UserError as exc:
        _fail(exc)
        return
    Console().print(table)
    if library:
        print(library_line())


@app.command("plan")
def plan_cmd(
    model: ModelOpt = None,
    gpu_gib: GpuGibOpt = None,
    utilization: UtilizationOpt = None,
    context_len: ContextLenOpt = None,
    margin: MarginOpt = None,
    overhead_gib: OverheadGibOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    gpus_per_node: GpusPerNodeOpt = None,
    nodes: Annotated[int | None, typer.Option(min=1, help="cluster view: nodes (default 1)")] = None,
    concurrency: ConcurrencyOpt = None,
    engine: EngineOpt = "vllm",
    block_size: Annotated[int, typer.Option(min=1, help="vLLM's KV block size in tokens (16 on a GPU)")] = 16,
    max_num_batched_tokens: MaxBatchedOpt = 2048,
    workload: WorkloadOpt = None,
    percentile: PercentileOpt = None,
    workload_format: WorkloadFormatOpt = None,
    custom_output_len: CustomOutputLenOpt = None,
    placement: PlacementOpt = False,
) -> None:
    """Predict weights, KV cache per token, KV tokens that fit and concurrent sequences per setup;
    with --gpus-per-node, also the GPUs each setup needs on a cluster and how many run at once;
    with --workload, max-model-len from the workload's lengths and the concurrency they allow;
    with --placement, where the config's setups (else each format) run by device class."""
    from qeval.backends import backend_entry, plan_kv_rule
    from qeval.memory.plan_command import PlanRequest, plan_setups
    from qeval.report.plan import show_plan

    request = PlanRequest(
        model=model,
        gpu_gib=gpu_gib,
        utilization=utilization,
        context_len=context_len,
        margin=margin,
        overhead_gib=overhead_gib,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        concurrency=concurrency,
        engine=engine,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        workload=workload,
        percentile=percentile,
        workload_format=workload_format,
        custom_output_len=custom_output_len,
    )
    try:
        planned = plan_setups(request, plan_kv_rule, backend_entry(engine).placement_lines if placement else None)
    except UserError as exc:
        _fail(exc)
        return
    show_plan(planned, as_json)


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
