"""Each setup's comparison with the baseline, task by task (and over an lm-eval group's tasks
pooled, and over a suite's average), from the stored per-sample records (docs/statistics.md),
and the check that a quantized KV cache changed anything at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from qeval.analysis.stats import (
    MIN_PAIRED_N,
    PairedComparison,
    average_difference_ci,
    finite,
    p_value,
    paired_accuracy,
    paired_clustered,
    paired_mean,
    paired_ratio,
    samples_to_decide,
    small_sample_reason,
    verdict,
)
from qeval.config import RunConfig
from qeval.config.gates import Gate
from qeval.config.setups import Setup
from qeval.records.store import RunStore
from qeval.results.metrics import describe
from qeval.results.samples import SampleRecord
from qeval.results.schema import Comparison, KLDistribution, SuiteScore

#: the verdict's reason where the difference or its interval is not a number
NON_FINITE_REASON = "non-finite scores: no evidence"

#: the per-sample field each comparable metric of qeval's own tasks is paired on
_PAIRED_FIELD = {
    "acc": "correct",
    "acc_norm": "correct_norm",
    "exact_match": "correct",
    "pass_at_k": "pass_at_k",
    "maj_at_k": "maj_at_k",
}


def pick_compared_metric(output_type: str, metrics: list[str]) -> str:
    """The metric a qeval task is compared on: the first of its metrics qeval can pair by
    document (perplexity tasks always on bits per byte)."""
    if output_type == "loglikelihood_rolling":
        return "bits_per_byte"
    default = "acc" if output_type == "multiple_choice" else "exact_match"
    return next((m for m in metrics if m in _PAIRED_FIELD), default)


@dataclass
class Paired:
    """One metric of one task (or several, pooled), baseline and setup, document by document.
    Ratio metrics (bits per byte) carry numerators and the shared denominator."""

    metric: str
    base: np.ndarray
    other: np.ndarray
    den: np.ndarray | None = None
    #: a sampled task's [documents, repeats] values a side (base, other: their means over repeats):
    #: compared clustered by document (stats.paired_clustered)
    repeats: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def binary(self) -> bool:
        return self.den is None and bool(np.isin(self.base, (0, 1)).all() and np.isin(self.other, (0, 1)).all())

    def base_value(self) -> float:
        return float(self.base.sum() / self.den.sum()) if self.den is not None else float(self.base.mean())

    def other_value(self) -> float:
        return float(self.other.sum() / self.den.sum()) if self.den is not None else float(self.other.mean())

    @staticmethod
    def pool(parts: list[Paired]) -> Paired:
        """Documents of several tasks as one: a group's size-weighted mean is the pooled mean."""
        dens = [p.den for p in parts if p.den is not None]
        base = np.concatenate([p.base for p in parts])
        other = np.concatenate([p.other for p in parts])
        # repeats pool only where every part has the same number (a cluster is a document either way)
        reps = [p.repeats for p in parts if p.repeats is not None]
        same = len(reps) == len(parts) and len({r[0].shape[1] for r in reps}) == 1
        pooled = (np.concatenate([r[0] for r in reps]), np.concatenate([r[1] for r in reps])) if same else None
        return Paired(parts[0].metric, base, other, np.concatenate(dens) if len(dens) == len(parts) else None, pooled)


def paired(store: RunStore, base: str, other: str, task: str, metric: str) -> Paired | None:
    """The setup's and the baseline's values of `metric` on `task`, paired by sample id; None
    when no sample pairs."""
    return paired_records(store.read_samples(base, task), store.read_samples(other, task), metric)


def paired_records(base: list[SampleRecord], other: list[SampleRecord], metric: str) -> Paired | None:
    """Two sides' sample records of one task (from one run, or two: `qeval compare`), their
    values of `metric` paired by sample id; None when no sample pairs."""
    b, o = _by_id(base), _by_id(other)
    ids = _paired_ids(b, o)
    if not ids:
        return None
    if metric == "bits_per_byte":
        bits = np.log(2)
        return Paired(
            metric,
            np.array([b[i].nll for i in ids], dtype=float) / bits,
            np.array([o[i].nll for i in ids], dtype=float) / bits,
            np.array([b[i].n_bytes for i in ids], dtype=float),
        )
    repeats = None
    if metric == "exact_match" and all(b[i].repeats is not None and o[i].repeats is not None for i in ids):
        rb = np.array([[r.correct for r in b[i].repeats or []] for i in ids], dtype=float)
        ro = np.array([[r.correct for r in o[i].repeats or []] for i in ids], dtype=float)
        repeats = (rb, ro) if rb.ndim == 2 and rb.shape == ro.shape else None
    return Paired(
        metric,
        np.array([_value(b[i], metric) for i in ids], dtype=float),
        np.array([_value(o[i], metric) for i in ids], dtype=float),
        repeats=repeats,
    )


def outputs_changed(base: list[SampleRecord], other: list[SampleRecord]) -> int | None:
    """Documents of a generation task whose generated text differs between the two sides, whether
    or not the answer's score moved (a greedy continuation the engine's numerics changed); None
    where the task generates nothing. Paired as `paired_records` pairs them."""
    b, o = _by_id(base), _by_id(other)
    texts = [(b[i].raw_output, o[i].raw_output) for i in _paired_ids(b, o)]
    if not texts or any(x is None or y is None for x, y in texts):
        return None
    return sum(x != y for x, y in texts)


def document_values(records: list[SampleRecord], metric: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One side's per-document values of `metric`, unpaired: for bits per byte the numerators
    (bits) and the denominators (bytes), else the values and None."""
    if metric == "bits_per_byte":
        return (
            np.array([r.nll for r in records], dtype=float) / np.log(2),
            np.array([r.n_bytes for r in records], dtype=float),
        )
    return np.array([_value(r, metric) for r in records], dtype=float), None


def _value(record: SampleRecord, metric: str) -> float:
    """A document's value of `metric`: qeval's own records hold correctness flags, lm-eval's a
    `metrics` dict of per-document values."""
    if record.metrics is not None and metric in record.metrics:
        return float(record.metrics[metric])
    return float(getattr(record, _PAIRED_FIELD[metric]))


def compare(data: Paired, task: str, seed: int, gates: list[Gate], higher_is_better: bool | None = None) -> Comparison:
    """The comparison of one task (or group) from its paired values, with its gate's verdict."""
    desc = describe(data.metric, higher_is_better)
    if data.repeats is not None:  # sampled: paired by document, clustered over its repeats
        cmp = paired_clustered(*data.repeats, data.metric, seed)
        method = "t_clustered"
    elif data.den is not None:
        cmp = paired_ratio(data.base, data.other, data.den, data.metric, seed)
        method = "t"
    elif data.binary:
        cmp = paired_accuracy(data.base, data.other, data.metric, seed)
        method = "newcombe"
    else:  # a per-document score that is not right/wrong (truthfulqa_mc2's probability mass)
        cmp = paired_mean(data.base, data.other, data.metric, seed)
        method = "t"
    base_value = data.base_value()
    recovery = data.other_value() / base_value if desc.higher_is_better and base_value > 0 else None
    out = Comparison(
        metric=data.metric,
        higher_is_better=desc.higher_is_better,
        delta=cmp.delta,
        ci=cmp.ci,
        ci_method=method,
        p_value=p_value(cmp.p_value),
        flips_to_wrong=cmp.flips_to_wrong,
        flips_to_right=cmp.flips_to_right,
        n=cmp.n,
        repeats=None if data.repeats is None else int(data.repeats[0].shape[1]),
        recovery=finite(recovery),
    )
    # a gate at a generated position is judged on its bucket (qeval/tasks/generation/results.py), not the task's score
    gates = [g for g in gates if g.position is None]
    gate = next((g for g in gates if g.task == task), None) or next((g for g in gates if g.task == "all"), None)
    if gate is not None:
        margin = gate.margin(base_value)
        out = out.model_copy(update={"gate": gate, "margin": margin} | _gated(cmp, desc.higher_is_better, margin))
    return out


def _gated(cmp: PairedComparison, higher_is_better: bool, margin: float) -> dict[str, object]:
    """The verdict, with the floor on n (stats.MIN_PAIRED_N: fewer documents are inconclusive
    whatever the interval says) and, when inconclusive, the documents that would decide it."""
    if not all(np.isfinite((cmp.delta, *cmp.ci, margin))):  # scores that were not numbers: no evidence
        return {"verdict": "inconclusive", "verdict_reason": NON_FINITE_REASON}
    result = verdict(cmp.ci, higher_is_better, margin)
    reason = small_sample_reason(cmp.n)
    if reason is not None:
        result = "inconclusive"
    out: dict[str, object] = {"verdict": result}
    if reason is not None:
        out["verdict_reason"] = reason
    if result == "inconclusive":
        out["samples_to_decide"] = samples_to_decide(cmp, higher_is_better, margin)
    return out


def compare_task(
    store: RunStore, base: str, other: str, task: str, metric: str, seed: int, gates: list[Gate]
) -> Comparison | None:
    """`other` against `base` on one stored task; None when no sample pairs. Tasks scored
    against the baseline's top-k (perplexity texts; the scored tokens of log-likelihood and
    multiple-choice tasks) add the KL to the baseline's next-token distribution and top-1 agreement."""
    data = paired(store, base, other, task, metric)
    if data is None:
        return None
    return compare(data, task, seed, gates).model_copy(update=kl_summary(store, other, task))


def kl_summary(store: RunStore, other: str, task: str) -> dict[str, Any]:
    """Token-weighted KL to the baseline and top-1 agreement over a task's documents (every one
    scored against the baseline's top-k, or none of this), and the token-level distribution the
    worker kept."""
    records = store.read_samples(other, task)
    if not records or not all(r.kl is not None for r in records):
        return {}
    w = np.array([r.kl_tokens for r in records], dtype=float)
    out: dict[str, Any] = {
        "kl": float(np.average([r.kl for r in records], weights=w)),
        "top1_agreement": float(np.average([r.top1_agreement for r in records], weights=w)),
    }
    meta = store.read_meta(other, task)
    dist = meta.kl_distribution if meta is not None else None
    if dist:  # absent from results stored before the distribution was kept
        out["kl_distribution"] = KLDistribution.model_validate(dist)
    return out


def compare_suite(parts: dict[str, tuple[Paired, Comparison]], gates: list[Gate], suite: str) -> SuiteScore:
    """A suite's average score against the baseline's, as recovery (setup / baseline), with an
    interval combined from the tasks' own intervals, and a recovery gate's verdict."""
    base = float(np.mean([p.base_value() for p, _ in parts.values()]))
    score = float(np.mean([p.other_value() for p, _ in parts.values()]))
    _, lo, hi = average_difference_ci([c.delta for _, c in parts.values()], [c.ci for _, c in parts.values()])
    out = SuiteScore(
        tasks=list(parts),
        score=score,
        baseline=base,
        recovery=score / base if base > 0 else None,
        ci=((base + lo) / base, (base + hi) / base) if base > 0 else None,
    )
    gate = next((g for g in gates if g.task == suite and g.min_recovery is not None), None)
    if gate is not None and out.ci is not None:
        assert gate.min_recovery is not None
        v = "pass" if out.ci[0] >= gate.min_recovery else "fail" if out.ci[1] < gate.min_recovery else "inconclusive"
        if any(c.n < MIN_PAIRED_N for _, c in parts.values()):
            v = "inconclusive"  # a task under the floor on n decides nothing, averaged or not
        out = out.model_copy(update={"verdict": v, "gate": gate})
    return out


def adjust_p_values(block: dict[str, Comparison]) -> dict[str, Comparison]:
    """Benjamini-Hochberg across a setup's tasks (scipy), so that many tasks do not
    manufacture a false alarm; sets `p_adjusted` beside each raw `p_value`."""
    from scipy.stats import false_discovery_control

    # a p-value that is not a probability (NaN, from scores that were not numbers) is no evidence:
    # left out of the adjustment, with none of its own, rather than failing the whole run
    block = {
        t: c
        if c.p_value is None or p_value(c.p_value) is not None
        else c.model_copy(update={"p_value": None, "p_adjusted": None})
        for t, c in block.items()
    }
    items = [(t, c) for t, c in block.items() if c.p_value is not None]
    if not items:
        return block
    adjusted = false_discovery_control([c.p_value for _, c in items], method="bh")
    return block | {t: c.model_copy(update={"p_adjusted": float(p)}) for (t, c), p in zip(items, adjusted, strict=True)}


def _by_id(records: list[SampleRecord]) -> dict[str, SampleRecord]:
    return {r.sample_id: r for r in records}


def _paired_ids(b: dict[str, SampleRecord], o: dict[str, SampleRecord]) -> list[str]:
    """The documents both sides scored from the same prompt, in the first side's order: a document
    prompted differently (a changed `!function` helper, say) is not a pair, its difference would
    measure the prompt, not the quantization."""
    return [i for i in b if i in o and b[i].prompt_hash == o[i].prompt_hash]


def weights_twin(cfg: RunConfig, setup: Setup) -> Setup | None:
    """The setup with the same weights and an unquantized KV cache, if the config has one."""
    return next(
        (s for s in cfg.setups if not s.quantizes_kv and s.control is None and s.weights_key() == setup.weights_key()),
        None,
    )


def outputs_identical(store: RunStore, a: str, b: str, tasks: list[str]) -> bool:
    """True when two setups produced the same outputs on every task (log-likelihoods,
    predictions and NLLs equal): a quantized KV cache that changed nothing."""
    for task in tasks:
        ra, rb = store.read_samples(a, task), store.read_samples(b, task)
        if not ra or len(ra) != len(rb):
            return False
        fields = ("prediction", "loglikelihoods", "nll")
        if any(getattr(x, f) != getattr(y, f) for x, y in zip(ra, rb, strict=True) for f in fields):
            return False
    return True
