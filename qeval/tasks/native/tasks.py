"""Task definitions (lm-evaluation-harness-style YAML) and their checksummed data.

A task YAML names its data (`dataset_path: json` + `data_files`, relative to the YAML,
or a hub dataset through the optional `datasets` package), the data's sha256, how a
document becomes a prompt (`doc_to_text`, `doc_to_target`, `doc_to_choice`, Jinja2
templates or plain field names, as in lm-evaluation-harness) and how it is scored
(`output_type`).
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2.sandbox import SecurityError
from pydantic import Field, ValidationError, model_validator

from qeval.errors import UserError
from qeval.files.jsonl import read_objects
from qeval.files.names import NAME_PATTERN
from qeval.files.yaml import load_yaml
from qeval.results.metrics import OutputType, select_metrics
from qeval.strict import Seed, Strict
from qeval.tasks.templates import render as _render

if TYPE_CHECKING:
    from qeval.tasks.chat import Chat


class GenerationKwargs(Strict):
    """How a generate_until task decodes: greedy (lm-eval's default), or sampled with
    `do_sample: true` and lm-eval's temperature / top_p / top_k, or the model card's
    (`from_model_card: true`: those of the model's generation_config.json; a key set here wins)."""

    until: list[str] = ["\n"]
    max_gen_toks: int = Field(default=32, gt=0)
    do_sample: bool = False
    temperature: float | None = Field(default=None, gt=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    from_model_card: bool = False

    @model_validator(mode="after")
    def _sampling(self) -> GenerationKwargs:
        knobs = [k for k in ("temperature", "top_p", "top_k") if getattr(self, k) is not None]
        if not self.do_sample and (knobs or self.from_model_card):
            raise ValueError(
                f"generation_kwargs: {(knobs or ['from_model_card'])[0]} needs do_sample: true "
                "(greedy decoding ignores it)"
            )
        if self.do_sample and not self.from_model_card and self.temperature is None:
            raise ValueError("generation_kwargs: do_sample needs a temperature (or from_model_card: true)")
        return self


class TaskSpec(Strict):
    """The YAML of one task (strict like a config: qeval/strict.py)."""

    task: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    output_type: OutputType
    dataset_path: str = "json"
    dataset_name: str | None = None
    data_files: str | None = None
    test_split: str = "test"
    dataset_sha256: str | None = None
    doc_id_field: str = "id"
    doc_to_text: str
    doc_to_target: str | None = None
    doc_to_choice: str | None = None
    target_delimiter: str = " "
    generation_kwargs: GenerationKwargs = GenerationKwargs()
    #: regex with one group applied to generations before exact match (lm-eval "filter")
    answer_regex: str | None = None
    metric_list: list[dict[str, Any]] = []
    #: sampled generation: documents are generated `repeats` times, repeat r with seed seeds[r]
    #: (default 0..repeats-1); scores are the mean over repeats (docs/tasks.md)
    repeats: int = Field(default=1, ge=1, le=64)
    seeds: list[Seed] | None = None
    metadata: dict[str, Any] = {}

    @model_validator(mode="after")
    def _repeats(self) -> TaskSpec:
        sampled = self.generation_kwargs.do_sample
        if sampled and self.output_type != "generate_until":
            raise ValueError("generation_kwargs.do_sample applies to generate_until tasks only")
        if self.repeats > 1 and not sampled:
            raise ValueError(
                f"repeats {self.repeats} needs sampling (generation_kwargs.do_sample: true): greedy "
                "repeats are identical"
            )
        if self.seeds is not None and len(self.seeds) != self.repeats:
            raise ValueError(f"seeds: {len(self.seeds)} given for repeats {self.repeats}")
        over_repeats = [m.get("metric") for m in self.metric_list if m.get("metric") in ("pass_at_k", "maj_at_k")]
        if over_repeats and self.repeats < 2:
            raise ValueError(f"metric {over_repeats[0]} needs repeats of 2 or more (sampled)")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: a seed given twice repeats the same draw")
        return self

    def repeat_seeds(self) -> list[int]:
        """The seed of each repeat."""
        return list(self.seeds) if self.seeds is not None else list(range(self.repeats))


@dataclass
class Task:
    """A loaded task: its spec, its verified documents and the checksum that keys its cache."""

    spec: TaskSpec
    yaml_path: Path
    docs: list[dict[str, Any]]
    sha256: str
    #: the chat settings its prompts are rendered under (the run's chat keys); None: plain
    chat: Chat | None = None
    #: a generation task's reasoning block ends here: scored on the text after it (the run's key)
    think_end_token: str | None = None
    #: the model's sampling keys (generation_config.json) for `from_model_card`; set by the kind
    model_card: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.task

    @property
    def output_type(self) -> str:
        return self.spec.output_type

    @property
    def n_docs(self) -> int:
        return len(self.docs)

    @property
    def entry(self) -> str:
        """The config entry the task came from: itself (lm-eval tasks may come from a group)."""
        return self.name

    @property
    def kind(self) -> str:
        return "native"

    @property
    def num_fewshot(self) -> int | None:
        return None  # qeval's own tasks are zero-shot: no few-shot count to record

    @property
    def compared_metric(self) -> str:
        """The metric setups are compared on: the first of its metrics that pairs by document."""
        from qeval.analysis.comparison import pick_compared_metric

        return pick_compared_metric(self.output_type, self.metrics)

    @cached_property
    def metrics(self) -> list[str]:
        """What the task reports (its metric_list, else its kind's metrics); the first that
        can be paired by document is what setups are compared on."""
        return select_metrics(self.name, self.spec.output_type, self.spec.metric_list)

    def doc_id(self, i: int) -> str:
        return str(self.docs[i].get(self.spec.doc_id_field, i))

    def text(self, doc: dict[str, Any]) -> str:
        return _render(self.spec.doc_to_text, doc)

    def prompt(self, doc: dict[str, Any]) -> str:
        """What the model is given for a multiple-choice or generation document: the text,
        rendered as the user turn of the chat template where the task has one."""
        text = self.text(doc)
        return self.chat.prompt(text) if self.chat is not None else text

    @property
    def choice_delimiter(self) -> str:
        """Between prompt and choice: the YAML's `target_delimiter`, none after a chat
        template's generation prompt (lm-eval's rule under `apply_chat_template`)."""
        return "" if self.chat is not None and self.chat.template is not None else self.spec.target_delimiter

    @property
    def chat_template_sha256(self) -> str | None:
        """Its chat settings by content, a part of its resume key (qeval/records/keys.py)."""
        return self.chat.sha256 if self.chat is not None else None

    def choices(self, doc: dict[str, Any]) -> list[str]:
        """The choices of a multiple-choice document: a list of non-empty strings (numbers
        are written out); anything else is a data error, not something to coerce."""
        assert self.spec.doc_to_choice is not None
        value = doc.get(self.spec.doc_to_choice)
        if value is None:
            value = ast.literal_eval(_render(self.spec.doc_to_choice, doc))
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"choices must be a list, got {type(value).__name__} {value!r:.60}")
        if len(value) < 2:
            raise ValueError(f"a multiple-choice document needs at least 2 choices, got {len(value)}")
        out = []
        for c in value:
            if isinstance(c, bool) or not isinstance(c, (str, int, float)):
                raise ValueError(f"choice {c!r:.60} is a {type(c).__name__}, not a string")
            if not str(c).strip():
                raise ValueError("a choice is empty")
            out.append(str(c))
        return out

    def target(self, doc: dict[str, Any]) -> str | int:
        """The gold answer: a choice index for multiple choice, a string otherwise."""
        spec = self.spec.doc_to_target
        if spec is None:
            return ""
        value = doc[spec] if spec in doc else _render(spec, doc)
        if self.spec.output_type == "multiple_choice":
            return _choice_index(value, self.choices(doc))
        return str(value)

    @cached_property
    def fingerprint(self) -> str:
        """Changes when the data or anything about how it is prompted or scored changes."""
        spec = json.dumps(self.spec.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256((self.sha256 + spec).encode()).hexdigest()[:16]


def _choice_index(value: Any, choices: list[str]) -> int:
    """A label as lm-eval reads it: an integer, a string of digits, or the text of a choice.
    `true` and `1.9` are not labels: they used to be coerced to 1 silently."""
    if isinstance(value, int) and not isinstance(value, bool):
        index = value
    elif isinstance(value, str) and value.strip().isdigit():
        index = int(value.strip())
    elif isinstance(value, str) and value in choices:
        index = choices.index(value)
    else:
        raise ValueError(f"label {value!r:.60} is not a choice index (an integer) or the text of a choice")
    if not 0 <= index < len(choices):
        raise ValueError(f"label {index} out of range for {len(choices)} choices")
    return index


def available_tasks(tasks_dir: Path) -> dict[str, Path]:
    """Task name -> YAML path for every task definition under `tasks_dir`."""
    found: dict[str, Path] = {}
    for path in sorted(tasks_dir.glob("*.yaml")):
        raw = load_yaml(path)
        if isinstance(raw, dict) and "task" in raw:
            found[str(raw["task"])] = path
    return found


def load_task(name: str, tasks_dir: Path, limit: int | None = None) -> Task:
    """Load, checksum-verify and parse one task; every problem is a one-line UserError."""
    paths = available_tasks(tasks_dir)
    if name not in paths:
        known = ", ".join(sorted(paths)) or "none"
        raise UserError(f"unknown task {name!r} (known in {tasks_dir}: {known})")
    path = paths[name]
    try:
        spec = TaskSpec.model_validate(load_yaml(path))
    except ValidationError as exc:
        from qeval.config import first_error

        raise UserError(f"{path}: {first_error(exc)}") from None
    docs, digest = _load_docs(spec, path)
    if spec.dataset_sha256 and digest != spec.dataset_sha256:
        raise UserError(f"{path}: dataset checksum mismatch (expected {spec.dataset_sha256[:12]}…, got {digest[:12]}…)")
    if not docs:
        raise UserError(f"{path}: the task has no documents: nothing to score or compare")
    task = Task(spec=spec, yaml_path=path, docs=docs[:limit] if limit else docs, sha256=digest)
    task.metrics  # noqa: B018 - an unknown metric in metric_list is refused here, before any model loads
    _check_docs(task)
    return task


def _load_docs(spec: TaskSpec, yaml_path: Path) -> tuple[list[dict[str, Any]], str]:
    if spec.dataset_path != "json":
        return _load_hub_docs(spec, yaml_path)
    if not spec.data_files:
        raise UserError(f"{yaml_path}: dataset_path json needs data_files")
    data = (yaml_path.parent / spec.data_files).resolve()
    if not data.is_file():
        raise UserError(f"{yaml_path}: data file {data} not found")
    raw = data.read_bytes()
    docs = [doc for _, doc in read_objects(data, raw)]
    return docs, hashlib.sha256(raw).hexdigest()


def _load_hub_docs(spec: TaskSpec, yaml_path: Path) -> tuple[list[dict[str, Any]], str]:
    """A hub (or any `datasets`-loadable) dataset; the checksum is over its rows as JSON."""
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"{yaml_path}: dataset_path {spec.dataset_path!r} needs the `datasets` package "
            "(pip install datasets), or ship the data as JSONL with dataset_path: json"
        ) from None
    try:
        ds = datasets.load_dataset(
            spec.dataset_path, spec.dataset_name, split=spec.test_split, data_files=spec.data_files
        )
    except Exception as exc:  # noqa: BLE001 - any loader failure is the user's data problem
        raise UserError(f"{yaml_path}: cannot load dataset {spec.dataset_path!r}: {exc}".splitlines()[0]) from None
    docs = [dict(row) for row in ds]
    blob = "\n".join(json.dumps(d, sort_keys=True, default=str) for d in docs).encode()
    return docs, hashlib.sha256(blob).hexdigest()


def _check_docs(task: Task) -> None:
    """Render every document once, so a template or field error surfaces before a model loads;
    and refuse duplicate ids, which would pair two documents as one in the comparison."""
    seen: dict[str, int] = {}
    for i, doc in enumerate(task.docs):
        doc_id = task.doc_id(i)
        if doc_id in seen:
            raise UserError(
                f"{task.yaml_path}: documents {seen[doc_id]} and {i} share the id {doc_id!r} "
                f"({task.spec.doc_id_field}); ids must be unique for the paired comparison"
            )
        seen[doc_id] = i
        try:
            task.text(doc)
            task.target(doc)
        except SecurityError as exc:
            raise UserError(f"{task.yaml_path}: document {i}: template refused by the sandbox ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - a template is untrusted code: whatever it raises is one line
            raise UserError(
                f"{task.yaml_path}: document {i} ({doc_id}): {type(exc).__name__}: {str(exc)[:200]}"
            ) from None
