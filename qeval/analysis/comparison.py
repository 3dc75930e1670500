"""Each setup's comparison with the baseline, task by task, from the stored per-sample records
(docs/statistics.md), and the check that a quantized KV cache changed anything at all."""

from __future__ import annotations

from typing import Any

import numpy as np

from qeval.analysis.gates import Gate
from qeval.analysis.stats import paired_accuracy, paired_ratio, verdict
from qeval.config import RunConfig
from qeval.results.schema import Comparison
from qeval.run.store import RunStore
from qeval.setups import Setup
from qeval.tasks.metrics import metric as describe

#: the per-sample field each comparable metric is paired on
_PAIRED_FIELD = {"acc": "correct", "acc_norm": "correct_norm", "exact_match": "correct"}


def compared_metric(output_type: str, metrics: list[str]) -> str:
    """The metric a task is compared on: the first of its metrics qeval can pair by document
    (perplexity tasks always on bits per byte)."""
    if output_type == "loglikelihood_rolling":
        return "bits_per_byte"
    default = "acc" if output_type == "multiple_choice" else "exact_match"
    return next((m for m in metrics if m in _PAIRED_FIELD), default)


def compare_task(store: RunStore, base: str, other: str, task: str, metric: str, seed: int,
                 gates: list[Gate]) -> Comparison | None:
    """`other` against `base` on `task`, paired by sample id; None when no sample pairs."""
    b, o = _by_id(store.read_samples(base, task)), _by_id(store.read_samples(other, task))
    ids = [i for i in b if i in o]
    if not ids:
        return None
    desc = describe(metric)
    if metric == "bits_per_byte":
        bits = np.log(2)
        cmp = paired_ratio(np.array([b[i]["nll"] for i in ids]) / bits, np.array([o[i]["nll"] for i in ids]) / bits,
                           np.array([b[i]["n_bytes"] for i in ids], dtype=float), metric, seed)
    else:
        field = _PAIRED_FIELD[metric]
        cmp = paired_accuracy(np.array([b[i][field] for i in ids]), np.array([o[i][field] for i in ids]), metric, seed)
    out = Comparison(metric=metric, higher_is_better=desc.higher_is_better, delta=cmp.delta, ci=cmp.ci,
                     ci_method="bootstrap" if metric == "bits_per_byte" else "newcombe",
                     p_value=cmp.p_value, flips_to_wrong=cmp.flips_to_wrong, flips_to_right=cmp.flips_to_right,
                     n=cmp.n)
    gate = next((g for g in gates if g.task == task), None) or next((g for g in gates if g.task == "all"), None)
    if gate is not None:
        base_value = _ratio(b, ids) if metric == "bits_per_byte" else float(np.mean([b[i][_PAIRED_FIELD[metric]]
                                                                                     for i in ids]))
        margin = gate.max_drop * (base_value if gate.relative else 1.0)
        out = out.model_copy(update={"verdict": verdict(cmp.ci, desc.higher_is_better, margin),
                                     "gate": gate, "margin": margin})
    if metric == "bits_per_byte" and all("kl" in o[i] for i in ids):
        w = np.array([o[i]["kl_tokens"] for i in ids], dtype=float)
        out = out.model_copy(update={"kl": float(np.average([o[i]["kl"] for i in ids], weights=w)),
                                     "top1_agreement": float(np.average([o[i]["top1_agreement"] for i in ids],
                                                                        weights=w))})
    return out


def _ratio(records: dict[str, dict[str, Any]], ids: list[str]) -> float:
    return float(sum(records[i]["nll"] for i in ids) / np.log(2) / sum(records[i]["n_bytes"] for i in ids))


def adjust_p_values(block: dict[str, Comparison]) -> dict[str, Comparison]:
    """Benjamini-Hochberg across a setup's tasks (scipy), so that many tasks do not
    manufacture a false alarm; sets `p_adjusted` beside each raw `p_value`."""
    from scipy.stats import false_discovery_control

    items = [(t, c) for t, c in block.items() if c.p_value is not None]
    if not items:
        return block
    adjusted = false_discovery_control([c.p_value for _, c in items], method="bh")
    return block | {t: c.model_copy(update={"p_adjusted": float(p)}) for (t, c), p in zip(items, adjusted, strict=True)}


def _by_id(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["sample_id"]: r for r in records}


def weights_twin(cfg: RunConfig, setup: Setup) -> Setup | None:
    """The setup with the same weights and an unquantized KV cache, if the config has one."""
    return next((s for s in cfg.setups if not s.quantizes_kv and s.weights_key() == setup.weights_key()), None)


def outputs_identical(store: RunStore, a: str, b: str, tasks: list[str]) -> bool:
    """True when two setups produced the same outputs on every task (log-likelihoods,
    predictions and NLLs equal): a quantized KV cache that changed nothing."""
    for task in tasks:
        ra, rb = store.read_samples(a, task), store.read_samples(b, task)
        if not ra or len(ra) != len(rb):
            return False
        fields = ("prediction", "loglikelihoods", "nll")
        if any(x.get(f) != y.get(f) for x, y in zip(ra, rb, strict=True) for f in fields):
            return False
    return True
