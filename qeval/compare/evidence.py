"""What compare needs before a (setup, task) of a run counts as evidence: its records, the meta
file that marks them stored and results.json telling one story (the same documents, the same
numbers, scored under the settings results.json records), and the chat settings its prompts
were rendered under, which the task's data fingerprint leaves out (docs/guarantees.md, "What
compare needs before it says no regression")."""

from __future__ import annotations

import json
import math
from typing import Any

from qeval.analysis.comparison import document_values
from qeval.compare.runs import LoadedRun
from qeval.config.chat import CHAT_KEYS
from qeval.errors import UserError
from qeval.files.atomic import read_json
from qeval.records.keys import key_of
from qeval.records.store import TaskMeta, task_meta
from qeval.results.metrics import describe
from qeval.results.schema import Results, SetupResult

#: metrics whose reported value is the mean of the documents' values (bits per byte: the ratio
#: of their sums), so the records must reproduce it; an lm-eval corpus metric (f1, bleu) need not
MEAN_METRICS = frozenset({"acc", "acc_norm", "exact_match", "pass_at_k", "maj_at_k", "bits_per_byte"})
#: the resume-key parts (qeval/records/keys.py) that chat settings add to a task's key
CHAT_PARTS = ("chat_template", "think_end_token")


def stored_problems(run: LoadedRun, setup: SetupResult, task: str) -> list[str]:
    """Why the stored records of `setup` on `task` (each member of an lm-eval group) are not
    the evidence results.json reports, one phrase each; empty: they are."""
    return [p for member in run.members(task) for p in _member_problems(run, setup, member)]


def _member_problems(run: LoadedRun, s: SetupResult, task: str) -> list[str]:
    info, score = run.results.tasks.get(task), s.tasks.get(task)
    where = f"samples/{s.name}/{task}"
    if info is None or score is None:
        return []
    metric = info.compared_metric
    has_records = run.store.samples_path(s.name, task).is_file()
    records = run.stored_records(s.name, task, metric)
    meta, unreadable = read_meta(run, s.name, task)
    if not has_records and meta is None:
        return []  # no records at all: compared on the reported scores, and said so
    if meta is None:
        return [unreadable or f"{where}.jsonl has no meta file beside it (never marked stored)"]
    out = []
    if has_records and len(records) != score.n:
        out.append(f"{where}.jsonl holds {len(records)} records, results.json says n = {score.n}")
    reported = score.metrics.get(metric)
    stored = _meta_value(meta, metric)
    m = describe(metric, info.higher_is_better)
    if meta.n != score.n or (reported is not None and stored != reported.value):
        shown = "—" if stored is None else m.fmt(stored)
        out.append(
            f"{where}.meta.json ({metric} {shown}, n = {meta.n}) is not what results.json "
            f"reports ({'—' if reported is None else m.fmt(reported.value)}, n = {score.n})"
        )
    if reported is not None and records and len(records) == score.n and metric.split(",", 1)[0] in MEAN_METRICS:
        values, dens = document_values(records, metric)
        value = float(values.sum() / dens.sum()) if dens is not None else float(values.mean())
        if not math.isclose(value, reported.value, rel_tol=1e-6, abs_tol=1e-9):
            out.append(f"the records give {metric} {m.fmt(value)}, results.json reports {m.fmt(reported.value)}")
    return out + _key_problems(meta, run.results, s, task, where)


def read_meta(run: LoadedRun, setup: str, task: str) -> tuple[TaskMeta | None, str | None]:
    """A stored task's meta file, typed, and, where it exists but cannot be used, why."""
    path = run.store.meta_path(setup, task)
    if not path.is_file():
        return None, None
    try:
        raw = read_json(path)
    except UserError as exc:
        return None, str(exc)
    return task_meta(raw, path) if isinstance(raw, dict) else (None, f"{path}: not a JSON object")


def _meta_value(meta: TaskMeta, metric: str) -> float | None:
    entry = meta.metrics.get(metric)
    return entry.value if entry is not None else None


def _key_problems(meta: TaskMeta, results: Results, s: SetupResult, task: str, where: str) -> list[str]:
    """The meta's resume-key parts against what results.json records of its run: a record
    scored under another batch size, model, setup or data is another run's."""
    parts = meta.key_parts
    if parts is None:
        return []  # stored before key parts were: nothing to check them against
    if key_of(parts) != meta.key:
        return [f"{where}.meta.json: its key is not the hash of its key parts"]
    expected = recorded_key_parts(results, s, task)
    diff = [
        f"{k} {str(parts[k])[:16]} (results.json: {v[:16]})"
        for k, v in expected.items()
        if v is not None and k in parts and str(parts[k]) != v
    ]
    if not diff:
        return []
    return [
        f"{where} was scored under other settings than results.json's run ({', '.join(diff)}): the records "
        "belong to another run (an interrupted rerun?)"
    ]


def recorded_key_parts(results: Results, s: SetupResult, task: str) -> dict[str, str | None]:
    """The resume-key parts of `s` on `task` (qeval/records/keys.py `setup_keys`) as results.json
    records them; None where it does not."""
    cfg, run = results.config, results.run
    batch = cfg.batch_size
    gen = cfg.generation_batch_size or (4 * batch if batch is not None else None)
    return {
        "model_sha256": run.model_sha256,
        "setup": s.spec.id,
        "qeval": run.qeval_version,
        "backend": run.backend,
        "device": run.device,
        "dtype": run.dtype,
        "limit": str(run.limit),
        "max_context": _text(cfg.model.max_context),
        "batch_size": _text(batch),
        "generation_batch_size": _text(gen),
        "task": results.tasks[task].fingerprint,
    }


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def chat_settings(run: LoadedRun, setup: str, task: str) -> tuple[dict[str, str], dict[str, str] | None]:
    """The chat settings `task` was prompted under in `run`: the config's chat keys (an lm-eval
    entry's own over the run's), and the chat parts of its stored resume keys (the rendered
    template's hash: a model's own template changes it too), None where a member's meta holds
    no key parts (stored before they were)."""
    cfg = run.results.config
    entry = run.results.tasks[task].entry or task
    lm_eval: dict[str, Any] = cfg.lm_eval or {}
    entries: list[Any] = lm_eval["tasks"] if isinstance(lm_eval.get("tasks"), list) else []
    own: dict[str, Any] = next((e for e in entries if isinstance(e, dict) and e.get("name") == entry), {})
    run_keys = cfg.chat_keys()
    keys = {k: own[k] if own.get(k) is not None else run_keys[k] for k in CHAT_KEYS}
    config = {k: json.dumps(v, sort_keys=True) for k, v in keys.items() if v is not None}
    stored: dict[str, str] = {}
    for member in run.members(task):
        meta, _ = read_meta(run, setup, member)
        parts = meta.key_parts if meta else None
        if parts is None:
            return config, None
        stored |= {f"{member}.{k}": str(parts[k]) for k in CHAT_PARTS if k in parts}
    return config, stored


def chat_difference(
    a: tuple[dict[str, str], dict[str, str] | None], b: tuple[dict[str, str], dict[str, str] | None]
) -> str | None:
    """Why two sides' prompts differ in their chat settings, in words; None: they do not."""
    keys = sorted(k for k in {*a[0], *b[0]} if a[0].get(k) != b[0].get(k))
    if a[1] is not None and b[1] is not None and a[1] != b[1] and not keys:
        keys = ["the rendered chat template"]
    return f"prompted under different chat settings ({', '.join(keys)})" if keys else None
