"""An lm-eval scoring interrupted between chunks of documents carries on from the last finished
chunk, instead of from document 0 (a full HellaSwag set is an hour on the 2-core machines).

After each chunk, `score_lm_eval` saves what it has built so far to the setup's scratch folder,
one file per `evaluate()` group, `lm_eval.<key>.state.npz`, written atomically (a kill leaves
the previous chunk's file whole; qeval/records/spool.py `save_state`):
- per task: its records spool and top-k spool (file names, records, bytes, rows: the files
  themselves are already on disk, and are cut back to these sizes on resume, so a chunk half
  written when the worker died is dropped and scored again);
- per task: lm-eval's per-document metric values so far (aggregated once, at the end) and the
  token-level divergence from the baseline (KL, top-1, Δp per scored token);
- per task: the few-shot samplers' random state, so each later document gets the examples one
  call over every document would have given it, and how many baseline references were taken;
- the first document of the next chunk.

The state is used only under the same key: the hash of the tasks' resume keys (model content,
setup, qeval version, task data, limit, batching: qeval/records/keys.py), the group's tasks and
their sizes, the chunk size and the few-shot seed. Anything else starts again from document 0.
The file is read as data (JSON inside an npz, no pickle) and the spool names it holds are
checked to be bare names in the scratch folder (qeval/records/spool.py)."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qeval.records.spool import discard_state, load_state, save_state


def state_name(key: str) -> str:
    return f"lm_eval.{key}"


def group_key(parts: dict[str, Any]) -> str:
    """The key of one evaluate() group's chunked scoring (see the module's docstring)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


#: a leaf's arrays in the state file (beside its JSON): the top-k's request lengths, and the
#: token-level divergence so far
_ARRAYS = ("topk_lengths", "kl", "top1", "dp")


@dataclass
class SavedLeaf:
    """One task's part of a saved state: what the scoring writes after a chunk
    (qeval/tasks/lm_eval/scoring.py `_LeafResult.state`) and reads back to carry on (`restore`)."""

    #: its records spool (qeval/records/spool.py RecordSpool.state: file, records, bytes)
    records: dict[str, Any]
    #: its top-k spool (TopkSpool.state: each array's file and rows), None: no top-k kept
    topk: dict[str, Any] | None
    topk_lengths: np.ndarray | None
    #: (metric, filter, per-document values so far): what evaluate() aggregates at the end
    raw_metrics: list[tuple[str, str, list[Any]]]
    topk_ok: bool
    requests_done: int
    references_taken: int
    #: the few-shot samplers' random states (rng_state)
    rng: dict[str, Any]
    kl: np.ndarray | None
    top1: np.ndarray | None
    dp: np.ndarray | None
    dp_missing: bool

    def as_json(self) -> dict[str, Any]:
        """The JSON part (the arrays go beside it)."""
        return {
            "records": self.records,
            "topk": self.topk,
            "topk_ok": self.topk_ok,
            "requests_done": self.requests_done,
            "dp_missing": self.dp_missing,
            "raw_metrics": [[m, f, v] for m, f, v in self.raw_metrics],
            "rng": self.rng,
            "references_taken": self.references_taken,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: a for name in _ARRAYS if (a := getattr(self, name)) is not None}

    @classmethod
    def read(cls, leaf: dict[str, Any], arrays: dict[str, np.ndarray]) -> SavedLeaf:
        """`as_json()` and `arrays()` as the state file gave them back (checked: JSON is data)."""
        return cls(
            records=dict(leaf["records"]),
            topk=leaf.get("topk"),
            topk_lengths=arrays.get("topk_lengths"),
            raw_metrics=[(str(m), str(f), list(v)) for m, f, v in leaf["raw_metrics"]],
            topk_ok=bool(leaf["topk_ok"]),
            requests_done=int(leaf["requests_done"]),
            references_taken=int(leaf["references_taken"]),
            rng=dict(leaf["rng"]),
            kl=arrays.get("kl"),
            top1=arrays.get("top1"),
            dp=arrays.get("dp"),
            dp_missing=bool(leaf["dp_missing"]),
        )


@dataclass
class SavedGroup:
    """A group's saved state: where the next chunk starts, and each task's part."""

    next_start: int
    leaves: dict[str, SavedLeaf]


def save(scratch: Path, key: str, next_start: int, leaves: dict[str, SavedLeaf]) -> None:
    """Write the group's state after a chunk: each task's JSON and arrays, one file, atomically,
    naming the spools it needs."""
    names = list(leaves)
    meta = {"key": key, "next_start": next_start, "leaves": [leaves[n].as_json() | {"name": n} for n in names]}
    files = [
        f
        for n in names
        for f in (leaves[n].records["file"], *(v[0] for v in (leaves[n].topk or {}).get("arrays", {}).values()))
    ]
    flat = {f"{i}.{k}": v for i, n in enumerate(names) for k, v in leaves[n].arrays().items()}
    save_state(scratch, state_name(key), meta, flat, files)


def discard(scratch: Path, key: str) -> None:
    """Remove the group's saved state (its spools go when the worker clears the folder)."""
    discard_state(scratch, state_name(key))


def load(scratch: Path, key: str) -> SavedGroup | None:
    """The group's saved state under `key`, or None where there is none or it cannot be read:
    then the scoring starts from document 0, as it would have before."""
    read = load_state(scratch, state_name(key))
    if read is None:
        return None
    meta, arrays = read
    try:
        if meta.get("key") != key:
            return None
        leaves = {
            str(leaf["name"]): SavedLeaf.read(leaf, {k: arrays[f"{i}.{k}"] for k in _ARRAYS if f"{i}.{k}" in arrays})
            for i, leaf in enumerate(meta["leaves"])
        }
        return SavedGroup(int(meta["next_start"]), leaves)
    except Exception:  # noqa: BLE001 - a damaged state in any way: start again, never a wrong result
        return None


def rng_state(task: Any) -> dict[str, Any]:
    """The random generators lm-eval 0.4.13 draws few-shot examples from: the task's
    `fewshot_rnd` and its sampler's `rnd` (lm_eval/api/task.py, api/samplers.py)."""
    out: dict[str, Any] = {}
    for name, rnd in (
        ("fewshot_rnd", getattr(task, "fewshot_rnd", None)),
        ("sampler", getattr(getattr(task, "sampler", None), "rnd", None)),
    ):
        if isinstance(rnd, random.Random):
            out[name] = rnd.getstate()
    return out


def set_rng_state(task: Any, state: dict[str, Any]) -> None:
    """Put `rng_state`'s states back (JSON turned their tuples into lists)."""
    for name, value in state.items():
        version, internal, gauss = value
        rnd = (
            getattr(task, "fewshot_rnd", None)
            if name == "fewshot_rnd"
            else getattr(getattr(task, "sampler", None), "rnd", None)
        )
        if isinstance(rnd, random.Random):
            rnd.setstate((version, tuple(internal), gauss))
