"""The decision (design §5): among setups that pass every gate and fit the budget,
recommend the one allowing the most concurrent sequences (ties: the smaller worst drop);
every other setup gets a one-line reason."""

from __future__ import annotations

import math
from typing import Any


def _pts(metric: str, x: float) -> str:
    return f"{100 * x:+.1f} pts" if metric in ("acc", "exact_match") else f"{x:+.4f}"


def _describe(task: str, c: dict[str, Any]) -> str:
    lo, hi = c["ci"]
    return f"{task} {_pts(c['metric'], c['delta'])} [{_pts(c['metric'], lo)}, {_pts(c['metric'], hi)}]"


def _margin_text(c: dict[str, Any]) -> str:
    g = c["gate"]
    return f"{g['max_drop'] * (100 if c['metric'] in ('acc', 'exact_match') and not g['relative'] else 1):g}" \
        + ("% relative" if g["relative"] else (" pt" if c["metric"] in ("acc", "exact_match") else ""))


def samples_to_decide(c: dict[str, Any]) -> int | None:
    """For an inconclusive verdict: total samples at which the CI (shrinking as 1/sqrt(n))
    would clear the margin, if the difference stayed where it is."""
    lo, hi = c["ci"]
    half = (hi - lo) / 2
    margin = c.get("margin")
    if margin is None or half <= 0:
        return None
    sign = 1 if c["higher_is_better"] else -1
    distance = abs(sign * c["delta"] + margin)
    if distance < 1e-12:
        return None
    return int(math.ceil(c["n"] * (half / distance) ** 2))


def worst_drop(setup: dict[str, Any]) -> float:
    drops = [-(c["delta"] if c["higher_is_better"] else -c["delta"]) for c in setup["vs_baseline"].values() if c]
    return max(drops, default=0.0)


def recommend(results: dict[str, Any]) -> dict[str, Any]:
    """Fill results["recommendation"]: {"setup", "reasons", "candidates", "blocked"}.

    No baseline result, no comparison, no recommendation: a setup is only ever recommended on
    evidence, a paired comparison with a baseline that ran, on every task of the run."""
    context = results["config"]["budget"]["context_len"]
    base = next((s for s in results["setups"] if s["baseline"]), None)
    if base is None or base["status"] != "ok":
        why = ("the baseline has no result in this run" if base is None
               else f"the baseline {base['name']} failed: {base['error']}")
        reasons = {s["name"]: f"{s['name']}: not compared, so not recommended: {why}" for s in results["setups"]}
        return {"setup": None, "reasons": reasons, "candidates": [], "blocked": why}
    reasons: dict[str, str] = {}
    eligible: list[dict[str, Any]] = []
    for s in results["setups"]:
        reason = _exclusion(s, context, list(results["tasks"]))
        if reason:
            reasons[s["name"]] = reason
        else:
            eligible.append(s)
    eligible.sort(key=lambda s: (-(s["memory"]["max_concurrency"] or 0), worst_drop(s)))
    best = eligible[0] if eligible else None
    for s in eligible[1:]:
        reasons[s["name"]] = (f"{s['name']}: passes every gate, but allows {s['memory']['max_concurrency']:g} sequences at {context} "
                              f"tokens against {best['memory']['max_concurrency']:g} for {best['name']}")  # type: ignore[index]
    if best is not None:
        reasons[best["name"]] = (f"{best['name']}: recommended: passes every gate and allows {best['memory']['max_concurrency']:g} "
                                 f"sequences at {context} tokens, the most of any passing setup")
    order = [s["name"] for s in results["setups"]]
    reasons = {n: reasons[n] for n in order if n in reasons}
    return {"setup": best["name"] if best else None, "reasons": reasons,
            "candidates": [s["name"] for s in eligible], "blocked": None}


def _exclusion(s: dict[str, Any], context: int, tasks: list[str]) -> str | None:
    name = s["name"]
    if s["status"] != "ok":
        return f"{name}: failed: {s['error']}"
    if not s["baseline"]:
        missing = [t for t in tasks if not (s["vs_baseline"].get(t) or {}).get("n")]
        if missing:
            return f"{name}: no paired comparison with the baseline on {', '.join(missing)}: no evidence, no pass"
    for task, c in s["vs_baseline"].items():
        if c and c.get("verdict") == "fail":
            return f"{name}: {_describe(task, c)}, fails the {_margin_text(c)} gate"
    for task, c in s["vs_baseline"].items():
        if c and c.get("verdict") == "inconclusive":
            need = samples_to_decide(c)
            more = f"; about {need} samples would decide it" if need else ""
            return f"{name}: {_describe(task, c)}, inconclusive against the {_margin_text(c)} gate{more}"
    conc = s["memory"].get("max_concurrency")
    if conc is None:
        return f"{name}: no memory figures to size it against the budget"
    if conc < 1:
        return f"{name}: fits only {conc:g} sequences of {context} tokens in the budget"
    return None
