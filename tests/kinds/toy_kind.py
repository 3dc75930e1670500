"""A task kind from outside qeval, registered through the registry alone (QEVAL_TASK_KINDS): its
config piece (`kinds: {toy: ...}`), its preflight expansion, its scoring in the worker, its
results block and its report section. Nothing in qeval/ names it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from qeval.config import RunConfig
from qeval.records.preflight import Preflight
from qeval.records.store import RunStore
from qeval.report.sections import HtmlTables, ReportSection
from qeval.report.tables import Escape, md_table
from qeval.results.schema import Results
from qeval.strict import Strict
from qeval.tasks.kinds import Scoring, TaskKind, plugin_spec, score_each
from qeval.tasks.native.tasks import Task, TaskSpec


class ToySpec(Strict):
    """The kind's config piece."""

    count: int = Field(12, gt=0, le=200)


@dataclass
class ToyTask(Task):
    @property
    def kind(self) -> str:
        return "toy"


def make_task(cfg: RunConfig) -> ToyTask:
    """Which of two numbers follows n: a multiple-choice task generated in memory."""
    spec: ToySpec = plugin_spec(cfg, "toy")
    docs = [
        {"id": str(i), "q": f"{i} + 1 =", "choices": [str(i + 1), str(i + 7)], "label": 0} for i in range(spec.count)
    ]
    task = TaskSpec(
        task="toy_next",
        output_type="multiple_choice",
        doc_to_text="{{q}}",
        doc_to_choice="choices",
        doc_to_target="label",
    )
    return ToyTask(task, Path(__file__), docs, hashlib.sha256(json.dumps(docs).encode()).hexdigest())


def expand(pre: Preflight, model_config: dict[str, Any]) -> None:
    if "toy" in pre.cfg.kinds:
        pre.tasks.append(make_task(pre.cfg))


def score(ctx: Scoring, names: list[str]) -> None:
    task = make_task(ctx.cfg)
    assert task.fingerprint == ctx.key_parts[task.name]["task"], "not the documents preflight keyed"
    score_each(ctx, [task])


def results_block(results: Results, pre: Preflight, store: RunStore) -> Results:
    rows = {s.name: len(store.read_samples(s.name, "toy_next")) for s in results.setups}
    return results.model_copy(update={"toy": {"samples_stored": rows}})


def _rows(results: Results, esc: Escape) -> list[list[str]]:
    block = (results.model_extra or {}).get("toy") or {"samples_stored": {}}
    return [[esc(name), str(n)] for name, n in block["samples_stored"].items()]


def markdown(results: Results, esc: Escape) -> list[str]:
    rows = _rows(results, esc)
    return ["## Toy kind", "", *md_table(["setup", "samples stored"], rows), ""] if rows else []


def tables(results: Results) -> HtmlTables:
    rows = _rows(results, str)
    return {"Samples stored per setup": (["setup", "samples stored"], rows)} if rows else {}


KIND = TaskKind(
    name="toy",
    expand=expand,
    score=score,
    results=results_block,
    spec=ToySpec,
    report=ReportSection(title="Toy kind", anchor="toy", markdown=markdown, tables=tables),
)
