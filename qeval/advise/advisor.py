"""`qeval advise`: measure each unit's sensitivity, choose the units to keep under a budget,
and check the mix on held-out documents against the uniform setup and random mixes of the
same byte cost (docs/advisor.md)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from qeval.advise.calibration import make_slice, read_texts
from qeval.advise.search import choose
from qeval.advise.sensitivity import ADVISOR_BACKEND, Probe
from qeval.advise.target import Options, allowance_of, budget_problem, pick_target
from qeval.advise.units import Unit, cells, unions
from qeval.analysis.stats import t_interval
from qeval.backends import backend_entry
from qeval.backends.device import resolve_device, resolve_precision
from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.ledger import predict_weights_bytes
from qeval.model.shape import ModelShape
from qeval.model.source import resolve_model
from qeval.results.advice import (
    Advice,
    AdviceCalibration,
    AdviceSearch,
    AdviceTiming,
    AdviceUnit,
    HeldoutMix,
    RandomDraw,
    VersusRandom,
)


def _weighted(per_doc: np.ndarray, docs: list[list[int]]) -> float:
    w = np.array([len(d) - 1 for d in docs], dtype=float)
    return float((per_doc * w).sum() / w.sum())


def advise(cfg: RunConfig, config_path: Path, opts: Options, log: Any = print, dtype: str | None = None) -> Advice:
    """Run the advisor on `cfg` (checked input: UserError for what is wrong). `dtype`: model.dtype
    as the run resolved it (its advise job's); None (`qeval advise`): resolved here."""
    target = pick_target(cfg, opts.target)
    source = resolve_model(cfg.model.path, cfg.model.revision)
    device = resolve_device(cfg.device)
    dtype = dtype or resolve_precision(cfg.model.dtype, source.config, device).dtype  # cfg keeps what was asked
    shape = ModelShape.from_config(source.config)
    cell_units = cells(shape, target, dtype)
    allowance, budget_bytes, basis = allowance_of(opts.budget, shape, target, dtype, cfg.budget.context_len)
    problem = budget_problem(
        opts.budget,
        allowance,
        budget_bytes,
        target.name,
        f"--budget {opts.budget}",
        sum(u.extra_bytes for u in cell_units),
    )
    if problem:
        raise UserError(problem)
    label, texts = read_texts(cfg, opts.text)

    t0 = time.perf_counter()
    backend: Any = backend_entry(ADVISOR_BACKEND).create(
        cfg.for_engine(dtype), Setup(name="advise-baseline", baseline=True), device
    )
    backend.load()
    names = [m for u in cell_units for m in u.modules]
    missing = [m for m in names if m not in dict(backend.model.named_modules())]
    if missing:
        raise UserError(f"the model has no module {missing[0]}: the advisor knows Llama-family layer names only")
    sl = make_slice(
        label, texts, backend.tok, n_calib=opts.calib_docs, n_heldout=opts.heldout_docs, max_len=cfg.model.max_context
    )
    probe = Probe(backend.model, target, names, batch_size=cfg.batch_size)
    load_s = time.perf_counter() - t0
    log(
        f"advise: {len(cell_units)} cells, calibration {sl.calib_tokens} tokens in {len(sl.calib)} documents "
        f"of {label}; target {target.name}"
    )

    t1 = time.perf_counter()
    probe.baseline(sl.calib)
    baseline_s = time.perf_counter() - t1
    everything = set(names)
    uniform = _weighted(probe.kl(sl.calib, everything), sl.calib)
    rows = []
    for n, u in enumerate(cell_units + (unions(cell_units) if opts.unions else [])):
        if n and n % 10 == 0:
            log(f"advise: {n} units measured, {time.perf_counter() - t1:.0f} s")
        cost = _weighted(probe.kl(sl.calib, set(u.modules)), sl.calib)
        gain = uniform - _weighted(probe.kl(sl.calib, everything - set(u.modules)), sl.calib)
        rows.append(
            AdviceUnit(unit=u.name, layer=u.layer, kind=u.kind, extra_bytes=u.extra_bytes, cost_kl=cost, gain_kl=gain)
        )
    passes, sens_s = probe.passes, time.perf_counter() - t1
    log(f"advise: sensitivity in {sens_s:.1f} s ({passes} passes, baseline {baseline_s:.2f} s)")

    cell_rows = rows[: len(cell_units)]
    choice = choose([r.gain_kl for r in cell_rows], [r.extra_bytes for r in cell_rows], allowance)
    kept_units = [cell_units[i] for i in choice.kept]
    advised = Setup.model_validate(
        target.model_dump()
        | {
            "name": opts.name or f"{target.name}-advised",
            "baseline": False,
            "optional": False,
            "keep": tuple(p for u in kept_units for p in u.keep_patterns()),
        }
    )
    kept_modules = {m for u in kept_units for m in u.modules}
    mix_calib_kl = _weighted(probe.kl(sl.calib, everything - kept_modules), sl.calib)

    mixes, versus = _verify(probe, sl.heldout, cell_units, kept_units, advised, target, shape, dtype, opts, log)
    timing = AdviceTiming(
        load_s=load_s,
        baseline_pass_s=baseline_s,
        sensitivity_s=sens_s,
        passes=float(passes),
        seconds_per_pass=(sens_s - baseline_s) / max(passes, 1),
        total_s=time.perf_counter() - t0,
    )
    backend.close()
    return Advice(
        config=str(config_path),
        model=cfg.model.path,
        dtype=dtype,
        device=device,
        target=target,
        budget=str(opts.budget),
        budget_bytes=budget_bytes,
        budget_basis=basis,
        calibration=AdviceCalibration(
            source=label, documents=len(sl.calib), tokens=sl.calib_tokens, heldout_documents=len(sl.heldout), top_k=32
        ),
        rows=rows,
        uniform_kl=uniform,
        search=AdviceSearch(
            method=choice.method,
            allowance_bytes=allowance,
            extra_bytes=choice.extra_bytes,
            kept=[u.name for u in kept_units],
            predicted_gain_kl=choice.predicted_gain,
            predicted_kl=uniform - choice.predicted_gain,
            measured_calib_kl=mix_calib_kl,
        ),
        setup=advised,
        mixes=mixes,
        versus_random=versus,
        timing=timing,
    )


def _verify(
    probe: Probe,
    heldout: list[list[int]],
    cell_units: list[Unit],
    kept: list[Unit],
    advised: Setup,
    target: Setup,
    shape: ModelShape,
    dtype: str,
    opts: Options,
    log: Any = print,
) -> tuple[list[HeldoutMix], VersusRandom]:
    """The uniform setup, the advised mix and random mixes of the same byte cost (as many
    attention and MLP cells, drawn anew) on the held-out documents, paired by document."""
    if not heldout:
        return [], VersusRandom(verdict="no held-out documents (--heldout-docs 0)")
    probe.baseline(heldout)
    everything = {m for u in cell_units for m in u.modules}

    def mix(name: str, units: list[Unit]) -> HeldoutMix:
        modules = {m for u in units for m in u.modules}
        setup = advised.model_copy(update={"keep": tuple(p for u in units for p in u.keep_patterns())})
        per_doc = probe.kl(heldout, everything - modules)
        return HeldoutMix(
            name=name,
            kept=[u.name for u in units],
            weights_bytes=predict_weights_bytes(shape, setup, dtype),
            heldout_kl=_weighted(per_doc, heldout),
            per_doc=[float(x) for x in per_doc],
        )

    mixes = [mix(target.name, []), mix(advised.name, kept)]
    rng = random.Random(opts.seed)
    by_kind = {k: [u for u in cell_units if u.kind == k] for k in ("attn", "mlp")}
    counts = {k: sum(1 for u in kept if u.kind == k) for k in by_kind}
    chosen = {u.name for u in kept}
    draws: list[list[Unit]] = []
    seen = {frozenset(chosen)}
    for _ in range(opts.random_draws if kept else 0):
        for _try in range(50):  # distinct draws, none equal to the advisor's own mix
            units = [u for k, pool in by_kind.items() for u in rng.sample(pool, counts[k])]
            if frozenset(u.name for u in units) not in seen:
                seen.add(frozenset(u.name for u in units))
                draws.append(units)
                break
    for i, units in enumerate(draws):
        mixes.append(mix(f"random-{i + 1}", units))
        log(f"advise: held-out check, random mix {i + 1} of {len(draws)}")
    if not draws:
        return mixes, VersusRandom(verdict="nothing kept: no random mix to compare")
    adv = np.array(mixes[1].per_doc)
    rand = np.array([m.per_doc for m in mixes[2:]])
    per_draw: list[RandomDraw] = []
    for m, r in zip(mixes[2:], rand, strict=True):
        d = r - adv  # > 0: the random mix drifts further from the baseline than the advisor's
        lo, hi = t_interval(float(d.mean()), float(d.std(ddof=1)), len(d))
        per_draw.append(RandomDraw(mix=m.name, mean_diff=float(d.mean()), ci95=[lo, hi]))
    d = rand.mean(0) - adv
    lo, hi = t_interval(float(d.mean()), float(d.std(ddof=1)), len(d))
    verdict = (
        "the advisor's mix is closer to the baseline than random mixes of the same bytes, beyond noise"
        if lo > 0
        else "random mixes of the same bytes are closer to the baseline, beyond noise"
        if hi < 0
        else "no difference beyond noise between the advisor's mix and random mixes of the same bytes"
    )
    return mixes, VersusRandom(
        documents=len(d),
        draws=len(draws),
        mean_diff=float(d.mean()),
        ci95=[lo, hi],
        draws_beaten=sum(1 for p in per_draw if p.ci95[0] > 0),
        per_draw=per_draw,
        verdict=verdict,
    )
