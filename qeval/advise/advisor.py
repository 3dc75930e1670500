"""`qeval advise`: measure each unit's sensitivity, choose the units to keep under a budget,
and check the mix on held-out documents against the uniform setup and random mixes of the
same byte cost (docs/advisor.md)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qeval.advise.calibration import Slice, make_slice, read_texts
from qeval.advise.kv import KvProbe, cheapest_order, kv_plan, kv_unions, kv_units
from qeval.advise.search import choose
from qeval.advise.sensitivity import ADVISOR_BACKEND, Probe, Scorer
from qeval.advise.target import Options, allowance_of, budget_problem, kv_target, pick_target
from qeval.advise.units import Unit, cells, unions
from qeval.analysis.stats import t_interval
from qeval.backends import backend_entry
from qeval.backends.device import resolve_device, resolve_precision
from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.ledger import predict_kv_bytes_per_token, predict_weights_bytes
from qeval.model.shape import ModelShape
from qeval.model.source import resolve_model
from qeval.results.advice import (
    Advice,
    AdviceCalibration,
    AdviceSearch,
    AdviceTiming,
    AdviceUnit,
    HeldoutMix,
    KvPlanRow,
    RandomDraw,
    VersusRandom,
)


def _weighted(per_doc: np.ndarray, docs: list[list[int]]) -> float:
    w = np.array([len(d) - 1 for d in docs], dtype=float)
    return float((per_doc * w).sum() / w.sum())


def advise(cfg: RunConfig, config_path: Path, opts: Options, log: Any = print, dtype: str | None = None) -> Advice:
    """Run the advisor on `cfg` (checked input: UserError for what is wrong). `dtype`: model.dtype
    as the run resolved it (its advise job's); None (`qeval advise`): resolved here."""
    target = kv_target(cfg, opts.target) if opts.kv else pick_target(cfg, opts.target)
    source = resolve_model(cfg.model.path, cfg.model.revision)
    device = resolve_device(cfg.device)
    dtype = dtype or resolve_precision(cfg.model.dtype, source.config, device).dtype  # cfg keeps what was asked
    shape = ModelShape.from_config(source.config)
    cell_units = kv_units(shape, target, dtype) if opts.kv else cells(shape, target, dtype)
    allowance, budget_bytes, basis = _allowance(cfg, opts, shape, target, dtype, cell_units)
    label, texts = read_texts(cfg, opts.text)
    t0 = time.perf_counter()
    backend, sl, probe = _prepare(cfg, opts, target, cell_units, label, texts, dtype, device)
    load_s = time.perf_counter() - t0
    log(
        f"advise: {len(cell_units)} cells, calibration {sl.calib_tokens} tokens in {len(sl.calib)} documents "
        f"of {label}; target {target.name}"
    )
    sens = _sensitivity(probe, sl.calib, cell_units, opts.unions, log, kv_unions if opts.kv else unions)
    search, kept_units, advised = (
        _kv_search(probe, sl.calib, sens, cell_units, target, opts)
        if opts.kv
        else _search(probe, sl.calib, sens, cell_units, allowance, target, opts)
    )
    mixes, versus = _verify(probe, sl.heldout, cell_units, kept_units, advised, target, shape, dtype, opts, log)
    timing = sens.timing(load_s, time.perf_counter() - t0)
    backend.close()
    plan, line = _kv_memory(cfg, shape, target, advised, dtype) if opts.kv else ([], None)
    return Advice(
        config=str(config_path),
        model=cfg.model.path,
        dtype=dtype,
        device=device,
        target=target,
        budget=str(opts.budget) if opts.budget is not None else f"KL at most {opts.kl_target:g}",
        budget_bytes=budget_bytes,
        budget_basis=basis,
        calibration=AdviceCalibration(
            source=label, documents=len(sl.calib), tokens=sl.calib_tokens, heldout_documents=len(sl.heldout), top_k=32
        ),
        rows=sens.rows,
        uniform_kl=sens.uniform,
        search=search,
        setup=advised,
        mixes=mixes,
        versus_random=versus,
        timing=timing,
        kv_plan=plan,
        serve_line=line,
    )


def _kv_memory(
    cfg: RunConfig, shape: ModelShape, target: Setup, advised: Setup, dtype: str
) -> tuple[list[KvPlanRow], str | None]:
    """The KV advice's memory beside the baseline's and every uniform KV setup of the config, and
    the `vllm serve` line that serves it (vLLM's translation: --kv-cache-dtype-skip-layers)."""
    uniform = [s for s in cfg.setups if s.quantizes_kv and not s.quantizes_weights and not s.kv_keep and not s.control]
    base = Setup(name=cfg.baseline.name, baseline=True)
    setups = [base, *uniform, advised] if target in uniform else [base, target, *uniform, advised]
    vllm = backend_entry("vllm")
    try:  # a KV dtype vLLM has no cache for (int2) has no line
        vllm.validate_setup(advised, "cuda")
    except UserError:
        return kv_plan(cfg, shape, setups, dtype), None
    # the dtype as the run resolved it (`bfloat16-if-native` is qeval's word, not vLLM's)
    line = vllm.serving.serve_line(cfg.for_engine(dtype), advised) if vllm.serving else None
    return kv_plan(cfg, shape, setups, dtype), line


def _allowance(
    cfg: RunConfig, opts: Options, shape: ModelShape, target: Setup, dtype: str, cell_units: list[Unit]
) -> tuple[int, int, str]:
    """The budget's allowance in bytes over the target, its bytes and basis; a UserError where
    the budget cannot be met or is no budget at all (advise/target.py `budget_problem`). The KV
    advisor has no byte budget: the cheapest assignment within its KL target (keeping every layer:
    the allowance's ceiling)."""
    if opts.kv:
        basis = f"the cheapest per-layer KV assignment whose calibration KL is at most {opts.kl_target:g}"
        return sum(u.extra_bytes for u in cell_units), 0, basis
    if opts.budget is None:
        raise UserError("--budget is required: e.g. --budget 4.5bpw or --budget 350MiB")
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
    return allowance, budget_bytes, basis


def _prepare(
    cfg: RunConfig,
    opts: Options,
    target: Setup,
    cell_units: list[Unit],
    label: str,
    texts: list[str],
    dtype: str,
    device: str,
) -> tuple[Any, Slice, Scorer]:
    """The loaded baseline model (the HF backend, its `model` and `tok`), the calibration and
    held-out documents tokenized, and the probe over its units; a UserError where the model has not
    the layer names the advisor knows."""
    backend: Any = backend_entry(ADVISOR_BACKEND).create(
        cfg.for_engine(dtype), Setup(name="advise-baseline", baseline=True), device
    )
    backend.load()
    names = [m for u in cell_units for m in u.modules]
    sl = make_slice(
        label, texts, backend.tok, n_calib=opts.calib_docs, n_heldout=opts.heldout_docs, max_len=cfg.model.max_context
    )
    if opts.kv:  # the layers' KV cache, through the backend's own per-layer cache
        cache_for = backend_entry(ADVISOR_BACKEND).kv_cache_for
        assert cache_for is not None  # the advisor's backend builds per-layer caches
        return backend, sl, KvProbe(backend.model, target, names, cache_for, batch_size=cfg.batch_size)
    missing = [m for m in names if m not in dict(backend.model.named_modules())]
    if missing:
        raise UserError(f"the model has no module {missing[0]}: the advisor knows Llama-family layer names only")
    return backend, sl, Probe(backend.model, target, names, batch_size=cfg.batch_size)


@dataclass
class _Sensitivity:
    """Every unit's measured cost and gain (cells first, then unions), the uniform setup's KL and
    what measuring took."""

    rows: list[AdviceUnit]
    uniform: float
    passes: int
    baseline_s: float
    sens_s: float

    def timing(self, load_s: float, total_s: float) -> AdviceTiming:
        """The advice's timing, with the model's load and the whole run's seconds."""
        return AdviceTiming(
            load_s=load_s,
            baseline_pass_s=self.baseline_s,
            sensitivity_s=self.sens_s,
            passes=float(self.passes),
            seconds_per_pass=(self.sens_s - self.baseline_s) / max(self.passes, 1),
            total_s=total_s,
        )


def _sensitivity(
    probe: Scorer,
    calib: list[list[int]],
    cell_units: list[Unit],
    with_unions: bool,
    log: Any,
    unions_of: Callable[[list[Unit]], list[Unit]] = unions,
) -> _Sensitivity:
    """Each unit's KL from the baseline kept alone (cost) and what keeping it saves the uniform
    setup (gain), on the calibration documents."""
    t1 = time.perf_counter()
    probe.baseline(calib)
    baseline_s = time.perf_counter() - t1
    everything = {m for u in cell_units for m in u.modules}
    uniform = _weighted(probe.kl(calib, everything), calib)
    rows = []
    for n, u in enumerate(cell_units + (unions_of(cell_units) if with_unions else [])):
        if n and n % 10 == 0:
            log(f"advise: {n} units measured, {time.perf_counter() - t1:.0f} s")
        cost = _weighted(probe.kl(calib, set(u.modules)), calib)
        gain = uniform - _weighted(probe.kl(calib, everything - set(u.modules)), calib)
        rows.append(
            AdviceUnit(unit=u.name, layer=u.layer, kind=u.kind, extra_bytes=u.extra_bytes, cost_kl=cost, gain_kl=gain)
        )
    passes, sens_s = probe.passes, time.perf_counter() - t1
    log(f"advise: sensitivity in {sens_s:.1f} s ({passes} passes, baseline {baseline_s:.2f} s)")
    return _Sensitivity(rows, uniform, passes, baseline_s, sens_s)


def _search(
    probe: Scorer,
    calib: list[list[int]],
    sens: _Sensitivity,
    cell_units: list[Unit],
    allowance: int,
    target: Setup,
    opts: Options,
) -> tuple[AdviceSearch, list[Unit], Setup]:
    """The cells to keep under the allowance, the advised setup that keeps them, and the mix's
    KL measured on the calibration documents."""
    cell_rows = sens.rows[: len(cell_units)]
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
    everything = {m for u in cell_units for m in u.modules}
    kept_modules = {m for u in kept_units for m in u.modules}
    search = AdviceSearch(
        method=choice.method,
        allowance_bytes=allowance,
        extra_bytes=choice.extra_bytes,
        kept=[u.name for u in kept_units],
        predicted_gain_kl=choice.predicted_gain,
        predicted_kl=sens.uniform - choice.predicted_gain,
        measured_calib_kl=_weighted(probe.kl(calib, everything - kept_modules), calib),
    )
    return search, kept_units, advised


def _kv_search(
    probe: Scorer, calib: list[list[int]], sens: _Sensitivity, units: list[Unit], target: Setup, opts: Options
) -> tuple[AdviceSearch, list[Unit], Setup]:
    """The cheapest layers to keep for the KV cache's KL to stay within the target: as many as the
    gains predict, then, measured as a whole on the calibration slice, one more at a time while
    it is not (at most every layer but one: keeping all is the baseline's cache)."""
    assert opts.kl_target is not None
    rows = sens.rows[: len(units)]
    choice = cheapest_order([r.gain_kl for r in rows], [r.extra_bytes for r in rows], sens.uniform, opts.kl_target)
    everything = {m for u in units for m in u.modules}
    most = min(len(choice.order), len(units) - 1)

    def measured(n: int) -> float:
        kept = {m for i in choice.order[:n] for m in units[i].modules}
        return _weighted(probe.kl(calib, everything - kept), calib)

    n = min(choice.kept, most)
    kl = measured(n)
    while kl > opts.kl_target and n < most:
        n += 1
        kl = measured(n)
    kept_units = sorted((units[i] for i in choice.order[:n]), key=lambda u: u.layer or 0)
    name = opts.name or f"{target.name}-advised"
    fields = {"name": name, "baseline": False, "optional": False, "kv_keep": tuple(str(u.layer) for u in kept_units)}
    advised = Setup.model_validate(target.model_dump() | fields)
    gain = sum(rows[i].gain_kl for i in choice.order[:n])
    search = AdviceSearch(
        method="greedy on KL gained per byte, to the KL target",
        allowance_bytes=sum(u.extra_bytes for u in units),  # keeping every layer: the baseline's cache
        extra_bytes=sum(u.extra_bytes for u in kept_units),
        kept=[u.name for u in kept_units],
        predicted_gain_kl=gain,
        predicted_kl=sens.uniform - gain,
        measured_calib_kl=kl,
        kl_target=opts.kl_target,
    )
    return search, kept_units, advised


def _verify(
    probe: Scorer,
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
        if opts.kv:
            setup = advised.model_copy(update={"kv_keep": tuple(sorted(modules, key=int))})
        else:
            setup = advised.model_copy(update={"keep": tuple(p for u in units for p in u.keep_patterns())})
        per_doc = probe.kl(heldout, everything - modules)
        return HeldoutMix(
            name=name,
            kept=[u.name for u in units],
            weights_bytes=predict_weights_bytes(shape, setup, dtype),
            kv_bytes_per_token=predict_kv_bytes_per_token(shape, setup, dtype) if opts.kv else None,
            heldout_kl=_weighted(per_doc, heldout),
            per_doc=[float(x) for x in per_doc],
        )

    mixes = [mix(target.name, []), mix(advised.name, kept)]
    draws = _draws(cell_units, kept, opts)
    for i, units in enumerate(draws):
        mixes.append(mix(f"random-{i + 1}", units))
        log(f"advise: held-out check, random mix {i + 1} of {len(draws)}")
    if not draws:
        return mixes, VersusRandom(verdict="nothing kept: no random mix to compare")
    return mixes, _versus(mixes[1], mixes[2:])


def _draws(cell_units: list[Unit], kept: list[Unit], opts: Options) -> list[list[Unit]]:
    """`opts.random_draws` random mixes of as many attention and MLP cells as `kept` (seeded),
    distinct, none equal to the advisor's own; none where nothing is kept."""
    rng = random.Random(opts.seed)
    # attention and MLP cells for weights; each attention kind's layers for the KV cache
    by_kind = {k: [u for u in cell_units if u.kind == k] for k in dict.fromkeys(u.kind for u in cell_units)}
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
    return draws


def _versus(advised: HeldoutMix, randoms: list[HeldoutMix]) -> VersusRandom:
    """The advised mix against each random mix and their mean, paired by held-out document."""
    adv = np.array(advised.per_doc)
    rand = np.array([m.per_doc for m in randoms])
    per_draw: list[RandomDraw] = []
    for m, r in zip(randoms, rand, strict=True):
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
    return VersusRandom(
        documents=len(d),
        draws=len(randoms),
        mean_diff=float(d.mean()),
        ci95=[lo, hi],
        draws_beaten=sum(1 for p in per_draw if p.ci95[0] > 0),
        per_draw=per_draw,
        verdict=verdict,
    )
