"""Scores that are not numbers (docs/guarantees.md, "Non-finite scores"): a setup whose
per-document values or task metrics hold NaN or an infinity (a checkpoint with a NaN weight, a
server answering NaN log-probs) scored nothing that can be compared. That is the setup's
failure, decided by the worker after scoring (the task is then not stored, so a rerun scores
it again) and again at assembly (results stored before this check, or by another path), never a
crash of the whole run, and never a NaN written into results.json, which JSON cannot hold."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from qeval.results.samples import SampleRecord
from qeval.results.schema import Figure, Memory, Results, SetupResult

#: a sample record's fields that hold scores: what the comparison, KL and the reports read
#: (lm-eval's per-document `metrics`; a long-context document's position `buckets`). Other
#: fields (the prompt, the target, the dataset's own values) are data, not scores.
SCORE_FIELDS = (
    "correct",
    "correct_norm",
    "nll",
    "loglikelihoods",
    "kl",
    "top1_agreement",
    "kl_tokens",
    "pass_at_k",
    "maj_at_k",
    "n_tokens",
    "n_bytes",
    "metrics",
    "buckets",
)

#: the most problems one failure reason names (a task with many bad fields stays one line)
_MAX_NAMED = 4


class NonFiniteScores(Exception):
    """A setup's scores that are not finite: the setup failed, with this one line as its reason."""


def is_bad(value: Any) -> bool:
    """True for a float (Python or numpy) that is NaN or infinite."""
    return isinstance(value, (float, np.floating)) and not math.isfinite(float(value))


def _worst(value: Any) -> str | None:
    """ "NaN" or "infinite" for the first non-finite number anywhere in `value` (nested lists,
    mappings and models walked without recursion), else None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if is_bad(v):
            return "NaN" if math.isnan(float(v)) else "infinite"
        if isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, BaseModel):  # a record's nested parts (position buckets)
            stack.extend(x for _, x in v)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def record_problems(records: Iterable[SampleRecord]) -> tuple[int, dict[str, tuple[int, str]]]:
    """(documents, {field: (documents where it is not finite, "NaN" or "infinite")}) over a task's
    sample records; `records` may be a spool, read once."""
    n = 0
    bad: dict[str, tuple[int, str]] = {}
    for rec in records:
        n += 1
        for f in SCORE_FIELDS:
            what = _worst(getattr(rec, f))
            if what is not None:
                count, first = bad.get(f, (0, what))
                bad[f] = (count + 1, first)
    return n, bad


def metric_problems(metrics: Any) -> dict[str, str]:
    """{metric: "NaN" or "infinite"} for each task metric whose value is not finite (a
    standard error that is not finite is not a problem: it is undefined at n = 1 and stored as null)."""
    if not isinstance(metrics, Mapping):
        return {}
    out = {}
    for name, m in metrics.items():
        what = _worst(m.get("value") if isinstance(m, Mapping) else m)
        if what is not None:
            out[str(name)] = what
    return out


def finite_metrics(metrics: Any) -> Any:
    """The task metrics without those whose value is not finite (anything but a mapping as it is:
    the schema's own check names it)."""
    if not isinstance(metrics, Mapping):
        return metrics
    bad = metric_problems(metrics)
    return {k: v for k, v in metrics.items() if str(k) not in bad}


def task_problem(task: str, records: Iterable[SampleRecord], metrics: Any, kl_distribution: Any = None) -> str | None:
    """One task's non-finite scores in words ("task ppl: nll is NaN on 3 of 3 documents, metric
    bits_per_byte is NaN"), or None when every score is finite."""
    n, bad = record_problems(records)
    by_kind: dict[str, list[str]] = {}
    for m, what in metric_problems(metrics).items():
        by_kind.setdefault(what, []).append(m)
    parts = [
        f"metric {names[0]} is {what}" if len(names) == 1 else f"metrics {', '.join(names)} are {what}"
        for what, names in by_kind.items()
    ]
    parts += [f"{f} is {what} on {count} of {n} document{'' if n == 1 else 's'}" for f, (count, what) in bad.items()]
    if (kl := _worst(kl_distribution)) is not None:
        parts.append(f"its KL distribution is {kl}")
    if not parts:
        return None
    more = f" (and {len(parts) - _MAX_NAMED} more)" if len(parts) > _MAX_NAMED else ""
    return f"task {task}: {', '.join(parts[:_MAX_NAMED])}{more}"


def failure_reason(problems: list[str]) -> str:
    """The setup's one-line failure from its tasks' problems."""
    return "non-finite scores: " + "; ".join(problems)


def non_finite_paths(value: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every non-finite number in a JSON-like value (a dumped results model),
    walked without recursion."""
    out: list[str] = []
    stack: list[tuple[str, Any]] = [(prefix, value)]
    while stack:
        path, v = stack.pop()
        if is_bad(v):
            out.append(path)
        elif isinstance(v, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), x) for i, x in enumerate(v))
    return sorted(out)


def finite_results(results: Results) -> Results:
    """The backstop before results.json is written (JSON has no NaN: pydantic would write null
    where a number is required, a file qeval then cannot read back). A setup whose entry still
    holds a non-finite number anywhere fails, naming where, and keeps only what is finite; if
    that is the baseline, no other setup keeps a comparison with it. The run's own blocks with
    one (the device's ceilings, the long-context tasks) are left out."""
    base = results.baseline
    setups = [s if not (paths := non_finite_paths(s.model_dump())) else _failed(s, paths) for s in results.setups]
    new_base = next((s for s in setups if s.baseline), None)
    if base is not None and base.status == "ok" and new_base is not None and new_base.status != "ok":
        setups = [s.model_copy(update={"vs_baseline": {}, "suites": {}}) for s in setups]
    update: dict[str, Any] = {"setups": setups}
    for block in ("ceilings", "long_context"):
        value = getattr(results, block)
        if value is not None and non_finite_paths(value.model_dump()):
            update[block] = None
    return results.model_copy(update=update)


def _failed(setup: SetupResult, paths: list[str]) -> SetupResult:
    """`setup` failed for the non-finite numbers at `paths`: its comparisons, and every task score
    and block holding one, left out; any other such number nulled."""
    dump = setup.model_dump()
    if setup.status == "ok":
        more = f" (and {len(paths) - _MAX_NAMED} more)" if len(paths) > _MAX_NAMED else ""
        dump |= {"status": "failed", "error": f"non-finite values in results: {', '.join(paths[:_MAX_NAMED])}{more}"}
    dump |= {
        "vs_baseline": {},
        "suites": {},
        "tasks": {t: v for t, v in dump["tasks"].items() if not non_finite_paths(v)},
    }
    for block in ("performance", "long_context"):
        if non_finite_paths(dump.get(block)):
            dump[block] = None
    try:
        return SetupResult.model_validate(_nulled(dump))
    except ValidationError:  # a required number was the non-finite one: the failure, without its figures
        return SetupResult(
            name=setup.name,
            baseline=setup.baseline,
            status="failed",
            error=dump["error"],
            spec=setup.spec,
            memory=Memory(weights_bytes=Figure(), kv_bytes_per_token=Figure()),
        )


def _nulled(value: Any) -> Any:
    """`value` (JSON-like) with every non-finite number replaced by None."""
    if is_bad(value):
        return None
    if isinstance(value, Mapping):
        return {k: _nulled(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulled(v) for v in value]
    return value
