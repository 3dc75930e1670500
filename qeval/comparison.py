"""Build each setup's `vs_baseline` block and the KV-cache effectiveness flag from the store."""

from __future__ import annotations

from typing import Any

import numpy as np

from qeval.config import Gate, RunConfig
from qeval.scoring import PRIMARY_METRIC
from qeval.setups import Setup
from qeval.stats import paired_accuracy, paired_ratio, verdict
from qeval.store import RunStore


def compare_task(store: RunStore, base: str, other: str, task: str, kind: str, seed: int,
                 gates: list[Gate]) -> dict[str, Any] | None:
    b, o = _by_id(store.read_samples(base, task)), _by_id(store.read_samples(other, task))
    ids = [i for i in b if i in o]
    if not ids:
        return None
    metric, higher = PRIMARY_METRIC[kind]
    if kind == "loglikelihood_rolling":
        bits = np.log(2)
        cmp = paired_ratio(np.array([b[i]["nll"] for i in ids]) / bits, np.array([o[i]["nll"] for i in ids]) / bits,
                           np.array([b[i]["n_bytes"] for i in ids], dtype=float), metric, seed)
    else:
        cmp = paired_accuracy(np.array([b[i]["correct"] for i in ids]), np.array([o[i]["correct"] for i in ids]), metric, seed)
    out: dict[str, Any] = {
        "metric": metric, "higher_is_better": higher, "delta": cmp.delta, "ci": list(cmp.ci),
        "p_value": cmp.p_value, "flips_to_wrong": cmp.flips_to_wrong, "flips_to_right": cmp.flips_to_right,
        "n": cmp.n, "verdict": None, "kl": None, "top1_agreement": None,
    }
    gate = next((g for g in gates if g.task == task), None) or next((g for g in gates if g.task == "all"), None)
    if gate is not None:
        base_value = np.mean([b[i]["correct"] for i in ids]) if higher else _ratio(b, ids)
        margin = gate.max_drop * (float(base_value) if gate.relative else 1.0)
        out["verdict"] = verdict(cmp.ci, higher, margin)
        out["gate"] = gate.model_dump()
        out["margin"] = margin
    if kind == "loglikelihood_rolling" and all("kl" in o[i] for i in ids):
        w = np.array([o[i]["kl_tokens"] for i in ids], dtype=float)
        out["kl"] = float(np.average([o[i]["kl"] for i in ids], weights=w))
        out["top1_agreement"] = float(np.average([o[i]["top1_agreement"] for i in ids], weights=w))
    return out


def _ratio(records: dict[str, dict[str, Any]], ids: list[str]) -> float:
    return float(sum(records[i]["nll"] for i in ids) / np.log(2) / sum(records[i]["n_bytes"] for i in ids))


def adjust_p_values(block: dict[str, dict[str, Any] | None]) -> None:
    """Benjamini-Hochberg across a setup's tasks (scipy), so that many tasks do not
    manufacture a false alarm; adds `p_adjusted` beside each raw `p_value`."""
    from scipy.stats import false_discovery_control

    items = [(t, c) for t, c in block.items() if c and c.get("p_value") is not None]
    if not items:
        return
    adjusted = false_discovery_control([c["p_value"] for _, c in items], method="bh")
    for (_, c), p in zip(items, adjusted):
        c["p_adjusted"] = float(p)


def _by_id(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["sample_id"]: r for r in records}


def weights_twin(cfg: RunConfig, setup: Setup) -> Setup | None:
    """The setup with the same weights and an unquantized KV cache, if the config has one."""
    return next((s for s in cfg.setups if not s.quantizes_kv and s.weights_twin() == setup.weights_twin()), None)


def outputs_identical(store: RunStore, a: str, b: str, tasks: list[str]) -> bool:
    """True when two setups produced the same outputs on every task (log-likelihoods,
    predictions and NLLs equal): a quantized KV cache that changed nothing."""
    for task in tasks:
        ra, rb = store.read_samples(a, task), store.read_samples(b, task)
        if not ra or len(ra) != len(rb):
            return False
        fields = ("prediction", "loglikelihoods", "nll")
        if any(x.get(f) != y.get(f) for x, y in zip(ra, rb) for f in fields):
            return False
    return True
