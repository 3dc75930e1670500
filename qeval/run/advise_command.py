"""`qeval advise`'s options resolved against the config's `advise:` block (each option given
overrides the block; without a block --budget is required), checked in one line each, and the
advice file's place checked before any work (docs/advisor.md). The command line (qeval/cli.py)
parses the options into an `AdviseRequest`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from qeval.errors import UserError

if TYPE_CHECKING:
    from qeval.advise.advisor import Options
    from qeval.config import RunConfig


# `qeval advise`'s longer options (qeval/cli.py), named so that its signature stays a list of names
BudgetOpt = Annotated[
    str | None,
    typer.Option(help="average bits per decoder-linear weight (4.5bpw) or memory at the budget's context (350MiB)"),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        help="the setup to lower (default: the config's first int4, else int8, quanto setup; with --kl-target "
        "its first quantized-KV setup)"
    ),
]
KlTargetOpt = Annotated[
    float | None,
    typer.Option(
        help="the KV advisor: the cheapest per-layer KV assignment whose calibration KL stays within this "
        "(docs/advisor.md, 'Which layers' KV cache to quantize')"
    ),
]
TextOpt = Annotated[
    Path | None,
    typer.Option(
        help="calibration text: plain text (paragraphs) or JSON Lines with `text` (default: the perplexity task)"
    ),
]
CalibDocsOpt = Annotated[int | None, typer.Option(help="documents the sensitivity is measured on [default: 16]")]
HeldoutDocsOpt = Annotated[int | None, typer.Option(help="further documents the mix is checked on [default: 32]")]
RandomDrawsOpt = Annotated[int | None, typer.Option(help="random mixes of the same bytes to compare with [default: 5]")]
UnionsOpt = Annotated[
    bool | None,
    typer.Option(
        "--unions/--no-unions",
        help="also measure whole blocks and module types, not only the layer x type cells [default: unions]",
    ),
]
AdviceOutputOpt = Annotated[
    Path | None,
    typer.Option(help="advice.md to write (.html and .json beside it); default reports/<config name>/advice.md"),
]


@dataclass(frozen=True)
class AdviseRequest:
    """`qeval advise`'s options as given (None: the block's value, or the default)."""

    config: Path
    budget: str | None = None
    target: str | None = None
    text: Path | None = None
    calib_docs: int | None = None
    heldout_docs: int | None = None
    random_draws: int | None = None
    seed: int | None = None
    unions: bool | None = None
    output: Path | None = None
    kl_target: float | None = None


def advise_plan(req: AdviseRequest) -> tuple[RunConfig, Options, Path]:
    """The config, the advisor's options and advice.md's path; UserError (one line) before any
    model loads for options that cannot be run or a path the advice could not be written to."""
    from qeval.advise.advisor import Options
    from qeval.advise.output import check_advice_output
    from qeval.advise.search import parse_budget
    from qeval.config import load_config
    from qeval.config.advise import AdviseSpec
    from qeval.run.rundir import check_output
    from qeval.strict import SEED_MAX

    cfg = load_config(req.config)
    block = cfg.advise or AdviseSpec(budget="1bpw")  # a stand-in for the defaults; its budget is never used
    kl_target = _kl_target(req, cfg)
    calib = block.calib_docs if req.calib_docs is None else req.calib_docs
    heldout = block.heldout_docs if req.heldout_docs is None else req.heldout_docs
    draws = block.random_draws if req.random_draws is None else req.random_draws
    if calib < 1 or heldout < 0 or draws < 0:
        raise UserError("--calib-docs must be at least 1, --heldout-docs and --random-draws at least 0")
    if heldout == 1:
        raise UserError("--heldout-docs 1: a paired interval needs at least 2 documents (or 0 for none)")
    if req.seed is not None and not 0 <= req.seed <= SEED_MAX:
        raise UserError(f"--seed {req.seed}: expected 0 to {SEED_MAX} (what numpy, torch and Python all take)")
    advice_path = req.output or Path("reports") / cfg.name / "advice.md"
    check_advice_output(advice_path)  # before the work: a path it cannot write would lose all of it
    check_output(advice_path, Path(cfg.model.path) if Path(cfg.model.path).is_dir() else None)
    cal_text = req.text if req.text is not None else (Path(block.text) if block.text else None)
    opts = Options(
        None
        if kl_target is not None
        else parse_budget(req.budget)
        if req.budget is not None
        else block.parsed_budget(),
        req.target if req.target is not None else block.target,
        cal_text,
        calib,
        heldout,
        draws,
        block.seed if req.seed is None else req.seed,
        block.unions if req.unions is None else req.unions,
        block.name if cfg.advise else None,
        kl_target,
    )
    return cfg, opts, advice_path


def _kl_target(req: AdviseRequest, cfg: RunConfig) -> float | None:
    """The KV advisor's KL target (the option, else the block's), None for the weight advisor; one
    line where both criteria or neither are given, or the target is no KL."""
    kl_target = req.kl_target if req.kl_target is not None else (cfg.advise.kl_target if cfg.advise else None)
    if kl_target is not None and not (0 < kl_target < 100):  # NaN included
        raise UserError(f"--kl-target {kl_target}: a KL in nats, above 0 (e.g. 0.02)")
    if kl_target is not None and req.budget is not None:
        raise UserError(
            "--kl-target and --budget: the KV advisor finds the cheapest assignment within the KL target; give one"
        )
    if req.budget is None and kl_target is None and (cfg.advise is None or cfg.advise.budget is None):
        raise UserError(
            "--budget is required: e.g. --budget 4.5bpw or --budget 350MiB (or --kl-target for the KV cache)"
        )
    return kl_target
