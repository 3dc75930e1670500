"""Assemble results.json (design §8) from what the workers stored."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qeval.comparison import adjust_p_values, compare_task, outputs_identical, weights_twin
from qeval.memory import predict_kv_bytes_per_token, predict_weights_bytes
from qeval.plan import RunPlan
from qeval.provenance import hardware
from qeval.recommend import recommend
from qeval.setups import Setup
from qeval.store import SCHEMA_VERSION, RunStore, key_difference

if TYPE_CHECKING:
    from qeval.runner import SetupKeys


def assemble_results(plan: RunPlan, store: RunStore, keys: dict[str, SetupKeys],
                     run_info: dict[str, Any]) -> dict[str, Any]:
    """results.json from the stored outcomes and samples *whose keys match this run*: a result
    stored under another model, data, setup, option or qeval version is dropped from the
    comparison and listed under `dropped` with what differs."""
    cfg = plan.cfg
    dropped: list[dict[str, Any]] = []
    setups, chosen = [], []
    for s in cfg.setups:
        if s.name in plan.skipped:
            continue
        outcome = store.read_outcome(s.name)
        if outcome is None and s not in plan.setups:
            continue  # never run into this directory: nothing to show
        if outcome is not None and outcome.get("key") != keys[s.name].key:
            dropped.append({"setup": s.name, "task": None,
                            "reason": key_difference(outcome.get("key_parts"), keys[s.name].parts)})
            continue
        setups.append(_setup_entry(plan, store, s, outcome, keys[s.name], dropped))
        chosen.append(s)
    ok = {e["name"]: e for e in setups if e["status"] == "ok"}
    base = cfg.baseline.name
    for entry, setup in zip(setups, chosen):
        if setup.name != base and entry["status"] == "ok" and base in ok:
            for t in plan.tasks:
                if t.name in entry["tasks"] and t.name in ok[base]["tasks"]:
                    cmp = compare_task(store, base, setup.name, t.name, t.spec.output_type, cfg.seed, cfg.gates)
                    if cmp is not None:
                        entry["vs_baseline"][t.name] = cmp
            adjust_p_values(entry["vs_baseline"])
        entry["flags"] += _ledger_gaps(entry)
        twin = weights_twin(cfg, setup) if setup.quantizes_kv else None
        if twin is not None and setup.name in ok and twin.name in ok:
            shared = [t for t in entry["tasks"] if t in ok[twin.name]["tasks"]]
            if shared and outputs_identical(store, setup.name, twin.name, shared):
                entry["flags"].append(f"kv_cache_no_effect: outputs identical to weights-only twin {twin.name!r}; "
                                      "the quantized KV cache was not exercised, do not read this as lossless")
    results = {
        "schema_version": SCHEMA_VERSION,
        "run": run_info | {"hardware": hardware()},
        "config": cfg.model_dump(mode="json"),
        "tasks": {t.name: {"output_type": t.spec.output_type, "n": len(t.docs), "sha256": t.sha256,
                           "fingerprint": t.fingerprint} for t in plan.tasks
                  if t.name in plan.run_tasks or any(t.name in e["tasks"] for e in setups)},
        "setups": setups,
        "dropped": dropped,
    }
    results["recommendation"] = recommend(results)
    return results


def _ledger_gaps(entry: dict[str, Any]) -> list[str]:
    """Predicted next to measured: a gap over 10% is flagged (design §3, issue 5)."""
    flags = []
    for name in ("weights_bytes", "kv_bytes_per_token"):
        fig = entry["memory"][name]
        m, p = fig["measured"], fig["predicted"]
        if m and p and abs(m - p) / p > 0.10:
            flags.append(f"memory_gap: {name} measured {m:,} vs predicted {p:,} ({(m - p) / p:+.0%})")
    return flags


def _setup_entry(plan: RunPlan, store: RunStore, setup: Setup, outcome: dict[str, Any] | None,
                 keys: SetupKeys, dropped: list[dict[str, Any]]) -> dict[str, Any]:
    outcome = outcome or {"status": "failed", "error": "not run"}
    entry: dict[str, Any] = {
        "name": setup.name, "baseline": setup.name == plan.cfg.baseline.name, "status": outcome["status"],
        "error": outcome.get("error"), "spec": setup.model_dump(mode="json") | {"id": setup.id},
        "memory": _ledger(plan, setup, outcome.get("memory") or {}), "tasks": {}, "vs_baseline": {}, "flags": [],
        "library_versions": outcome.get("library_versions", {}), "quantization": outcome.get("quantization", {}),
        "timings": outcome.get("timings", {}),
    }
    for t in plan.tasks:
        meta = store.read_meta(setup.name, t.name)
        if meta is None:
            continue
        if meta.get("key") != keys.task_key(t.name):
            dropped.append({"setup": setup.name, "task": t.name,
                            "reason": key_difference(meta.get("key_parts"), keys.tasks[t.name])})
            continue
        entry["tasks"][t.name] = {"n": meta["n"], "metrics": meta["metrics"]}
    missing = [t for t in plan.run_tasks if t not in entry["tasks"]]
    if outcome["status"] == "ok" and setup in plan.setups and missing:
        entry["status"], entry["error"] = "failed", f"no stored results for {', '.join(missing)}"
    return entry


def _ledger(plan: RunPlan, setup: Setup, measured: dict[str, Any]) -> dict[str, Any]:
    """Predicted next to measured, each measured figure with its source (design §3)."""
    def fig(name: str, predicted: int | None) -> dict[str, Any]:
        m = measured.get(name, {})
        return {"measured": m.get("measured"), "predicted": predicted, "source": m.get("source", "not measured")}

    shape, dtype = plan.shape, plan.cfg.model.dtype
    ledger = {
        "weights_bytes": fig("weights_bytes", predict_weights_bytes(shape, setup, dtype) if shape else None),
        "kv_bytes_per_token": fig("kv_bytes_per_token", predict_kv_bytes_per_token(shape, setup, dtype) if shape else None),
        "peak_bytes": fig("peak_bytes", None) | {k: v for k, v in measured.get("peak_bytes", {}).get("extra", {}).items()},
        "activations_bytes": fig("activations_bytes", None),
    }
    if "overhead_bytes" in measured:
        ledger["overhead_bytes"] = fig("overhead_bytes", None)
    engine = _engine_pool(plan, measured)
    if engine:
        ledger["engine"] = engine
    if engine and plan.device == "cuda":  # vLLM sized its KV pool on the GPU itself: that, not a prediction
        ctx = plan.cfg.budget.context_len
        ledger |= {"kv_cache_tokens": engine["kv_cache_tokens"],
                   "max_concurrency": round(engine["kv_cache_tokens"] / ctx, 2),
                   "capacity_source": f"vLLM engine on this GPU ({engine['source']}); concurrency = tokens / {ctx}"}
    else:
        ledger |= _capacity(plan, ledger)
    return ledger


def _engine_pool(plan: RunPlan, measured: dict[str, Any]) -> dict[str, Any] | None:
    """The KV pool the vLLM engine reported: tokens, and sequences at its max_model_len as it
    logged them. On the CPU build the pool is a share of host memory
    (engine.cpu_memory_utilization), so it says nothing about the budget: the recommendation
    then uses the budget prediction, and this stays a record of what the engine did."""
    tokens = measured.get("kv_cache_tokens", {})
    if tokens.get("measured") is None:
        return None
    conc = measured.get("max_concurrency", {})
    e = plan.cfg.engine
    pool = (f"GPU memory x {plan.cfg.budget.utilization} (budget.utilization)" if plan.device == "cuda"
            else f"host memory x {e.cpu_memory_utilization} (engine.cpu_memory_utilization)")
    return {"kv_cache_tokens": tokens["measured"], "max_concurrency": conc.get("measured"),
            "max_concurrency_context": conc.get("extra", {}).get("context"), "pool": pool,
            "source": "vLLM engine log: " + "; ".join(filter(None, [tokens.get("extra", {}).get("line"),
                                                                   conc.get("extra", {}).get("line")]))}


def _capacity(plan: RunPlan, ledger: dict[str, Any]) -> dict[str, Any]:
    """KV tokens that fit the budget and sequences at its context length. The transformers
    backend has no KV pool of its own, so these are predictions from the measured bytes."""
    b = plan.cfg.budget
    w = ledger["weights_bytes"]["measured"] or ledger["weights_bytes"]["predicted"]
    kv = ledger["kv_bytes_per_token"]["measured"] or ledger["kv_bytes_per_token"]["predicted"]
    if not w or not kv:
        return {"kv_cache_tokens": None, "max_concurrency": None}
    free = b.gpu_memory_gib * 2**30 * b.utilization - w
    tokens = max(int(free // kv), 0)
    return {"kv_cache_tokens": tokens, "max_concurrency": round(tokens / b.context_len, 2),
            "capacity_source": f"predicted for the budget ({b.gpu_memory_gib} GiB x {b.utilization}, "
                               f"{b.context_len}-token sequences) from the weights and KV bytes above "
                               "(measured where measured, else predicted)"}
