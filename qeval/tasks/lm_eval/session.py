"""lm-evaluation-harness tasks loaded for a run: names resolved (the config's include paths
first, then lm-eval's library), groups expanded to their tasks, few-shot settings applied, and
each task described for qeval (kind, documents, metrics, the metric compared, a fingerprint of
everything that decides its requests and scoring).

Route: qeval drives lm-eval's documented external API (an `lm_eval.api.model.LM` served by
qeval's backends, `lm_eval.evaluator.evaluate(..., log_samples=True)`): lm-eval keeps its
prompts, few-shot sampling, `process_docs`, filters and metrics; qeval does the model work in
one batched call per request type. Written against lm-eval 0.4.13.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.config.lm_eval import LmEvalSpec, LmEvalTask
from qeval.errors import UserError
from qeval.files.names import NAME_PATTERN
from qeval.tasks.lm_eval.yamls import materialize, read_task_yaml

if TYPE_CHECKING:
    from qeval.tasks.chat import Chat

#: a task entry's chat settings resolved against the model (qeval/tasks/chat.py), or None
ChatFor = Callable[[LmEvalTask], "Chat | None"]

_ADDR = re.compile(r" at 0x[0-9a-f]+>")


@dataclass
class LmEvalTaskInfo:
    """One lm-eval task (a leaf: groups are expanded) as qeval's pipeline sees it."""

    name: str
    entry: str  # the config entry (task or group) it came from
    output_type: str
    n_docs: int
    metrics: list[str]  # "acc", "acc_norm", "exact_match,strict-match", ... (filter "none" dropped)
    compared_metric: str  # the metric setups are compared on
    fingerprint: str
    sha256: str  # of the documents scored and the few-shot pool
    num_fewshot: int
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    limit: int | None = None
    #: the chat settings' hash (qeval/tasks/chat.py), a part of the resume key; None: plain prompts
    chat_template_sha256: str | None = None
    #: a generation task's reasoning block ends here: scored on the text after it (resume key part)
    think_end_token: str | None = None

    @property
    def kind(self) -> str:
        return "lm_eval"


@dataclass
class LmEvalSession:
    """lm-eval's task objects for a run, and qeval's description of them."""

    spec: LmEvalSpec
    tasks: dict[str, Any]  # leaf name -> lm_eval ConfigurableTask
    infos: dict[str, LmEvalTaskInfo]
    groups: dict[str, list[str]]  # group -> its leaf tasks (nested groups flattened)
    workdir: tempfile.TemporaryDirectory[str]
    #: leaf -> the chat settings it is prompted under (None: lm-eval's plain prompts)
    chats: dict[str, Chat | None] = field(default_factory=dict)

    def close(self) -> None:
        self.workdir.cleanup()


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def sandbox_templates() -> None:
    """lm-eval renders prompt templates with a plain Jinja2 Environment; qeval swaps in its
    sandboxed one (qeval/tasks/templates.py), so a task YAML cannot reach for internals."""
    import lm_eval.utils as lm_utils

    from qeval.tasks.templates import sandbox_environment

    env = sandbox_environment()
    env.filters.update(lm_utils.env.filters)
    lm_utils.env = env


def open_session(
    spec: LmEvalSpec,
    base: Path,
    limit: int | None,
    chat_for: ChatFor | None = None,
    think_for: Callable[[LmEvalTask], str | None] | None = None,
) -> LmEvalSession:
    """Load every task of `spec` (paths relative to `base`); one-line UserErrors for unknown
    names, unreadable data or a task qeval cannot score. `chat_for` gives each entry's chat
    settings (None: every task plain, lm-eval's default arguments), `think_for` its
    `think_end_token`."""
    _quiet()
    workdir = tempfile.TemporaryDirectory(prefix="qeval-lm-eval-")
    entries = spec.entries()
    names = [t.name for t in entries]
    manager = _manager(spec, base, entries, Path(workdir.name) / "tasks")
    try:
        loaded = manager.load(names)
    except Exception as exc:  # noqa: BLE001 - a missing data file, a hub dataset offline...: one line
        raise UserError(
            f"lm-eval tasks {', '.join(names)}: cannot load: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    groups = _leaves_of_groups(loaded["group_map"])
    session = LmEvalSession(spec, {}, {}, {g: groups[g] for g in names if g in groups}, workdir)
    for entry in entries:
        chat = chat_for(entry) if chat_for is not None else None
        for leaf in groups.get(entry.name, [entry.name]):
            task = loaded["tasks"][leaf]
            session.tasks[leaf] = task
            session.chats[leaf] = chat
            session.infos[leaf] = describe(leaf, entry, task, spec.fewshot_seed, entry.limit or limit)
            session.infos[leaf].chat_template_sha256 = chat.sha256 if chat is not None else None
            if think_for is not None and task.OUTPUT_TYPE == "generate_until":
                session.infos[leaf].think_end_token = think_for(entry)
    return session


def _quiet() -> None:
    """lm-eval and datasets set up for a run: offline as the hub is, no progress bars, errors only."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    # lm-eval and datasets draw tqdm bars on stderr; qeval shows its own progress, and an error
    # must stay one line
    os.environ["TQDM_DISABLE"] = "1"
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    sandbox_templates()


def _manager(spec: LmEvalSpec, base: Path, entries: list[LmEvalTask], tasks_dir: Path) -> Any:
    """lm-eval's TaskManager over the include folders, materialized in `tasks_dir` with each
    entry's data overrides (lm-eval's own library too where they miss a name: UserError for
    a name neither knows)."""
    from lm_eval.tasks import TaskManager

    overrides = {t.name: _data_overrides(t) for t in entries if _data_overrides(t)}
    paths = [(base / p).resolve() if not Path(p).is_absolute() else Path(p) for p in spec.include_path]
    data_dirs = [(base / p).resolve() if not Path(p).is_absolute() else Path(p) for p in spec.data_dirs]
    folder = materialize(paths, overrides, tasks_dir, data_dirs)
    local = TaskManager(include_defaults=False, include_path=str(folder))
    names = [t.name for t in entries]
    manager = (
        local
        if all(n in local.all_subtasks or n in local.all_groups for n in names)
        else TaskManager(include_path=str(folder))
    )  # lm-eval's own library: its index takes ~10 s to build
    unknown = [n for n in names if n not in manager.all_subtasks and n not in manager.all_groups]
    if unknown:
        raise UserError(_unknown_task(unknown[0], folder))
    return manager


def _unknown_task(name: str, folder: Path) -> str:
    """Why lm-eval does not know `name`: a YAML of the include path that defines it but that
    lm-eval dropped while indexing (it skips such a file silently) gets its real error."""
    from lm_eval import utils as lm_utils

    for path in sorted(folder.rglob("*.yaml")):
        doc = read_task_yaml(path)
        if name in (doc.get("task"), doc.get("group")):
            try:
                lm_utils.load_yaml_config(str(path))
            except Exception as exc:  # noqa: BLE001 - whatever lm-eval tripped on is the cause to show
                return (
                    f"lm-eval task {name!r} ({path.name}): lm-eval cannot load it: {type(exc).__name__}: "
                    f"{(str(exc).splitlines() or [''])[0][:300]}"
                )
            return f"lm-eval task {name!r} ({path.name}) is defined, but lm-eval's index dropped it"
    return f"unknown lm-eval task {name!r} (not in lm_eval.include_path nor lm-eval {lm_eval_version()}'s library)"


def _data_overrides(t: LmEvalTask) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if t.dataset_path is not None:
        out["dataset_path"] = t.dataset_path
        out["dataset_name"] = t.dataset_name
    if t.dataset_kwargs is not None:
        out["dataset_kwargs"] = t.dataset_kwargs
    return out


def _leaves_of_groups(group_map: dict[str, list[str]]) -> dict[str, list[str]]:
    """group -> its leaf tasks in order, nested groups flattened."""

    def leaves(name: str) -> list[str]:
        return [leaf for child in group_map[name] for leaf in (leaves(child) if child in group_map else [child])]

    return {g: leaves(g) for g in group_map}


def describe(leaf: str, entry: LmEvalTask, task: Any, seed: int, limit: int | None) -> LmEvalTaskInfo:
    """Apply the entry's settings to the lm-eval task object and describe it for qeval."""
    if not re.fullmatch(NAME_PATTERN, leaf):
        raise UserError(
            f"lm-eval task name {leaf!r} cannot be stored safely (qeval names are letters, digits, '.', '_', '-')"
        )
    _apply(leaf, entry, task, seed)
    metrics = task_metrics(task)
    # perplexity tasks are compared on bits per byte (paired by document), whatever comes first
    default = (
        "bits_per_byte" if task.OUTPUT_TYPE == "loglikelihood_rolling" and "bits_per_byte" in metrics else metrics[0]
    )
    compared = entry.metric or default
    if compared not in metrics:
        raise UserError(f"lm-eval task {leaf}: metric {compared!r} is not one it reports ({', '.join(metrics)})")
    if task.OUTPUT_TYPE not in ("multiple_choice", "generate_until", "loglikelihood_rolling", "loglikelihood"):
        raise UserError(f"lm-eval task {leaf}: output type {task.OUTPUT_TYPE} is not one qeval scores")
    docs = list(task.eval_docs)
    n = min(len(docs), limit) if limit else len(docs)
    data = _data_sha256(task, docs)
    fingerprint = _fingerprint(task, n, data, seed)
    return LmEvalTaskInfo(
        name=leaf,
        entry=entry.name,
        output_type=task.OUTPUT_TYPE,
        n_docs=n,
        metrics=metrics,
        compared_metric=compared,
        fingerprint=fingerprint,
        sha256=data,
        num_fewshot=int(task.get_config("num_fewshot") or 0),
        higher_is_better={m.split(",")[0]: bool(v) for m, v in task.higher_is_better().items()},
        limit=n if n < len(docs) else None,
    )


def _apply(leaf: str, entry: LmEvalTask, task: Any, seed: int) -> None:
    """The entry's shots and max_gen_toks set on the lm-eval task, its few-shot sampler seeded
    (UserError where the pool is too small for the shots)."""
    yaml_shots = task.get_config("num_fewshot")
    if entry.num_fewshot is not None and yaml_shots != 0:  # simple_evaluate's rule: a YAML's 0 stays 0
        task.set_config("num_fewshot", entry.num_fewshot)
    elif yaml_shots is None:
        task.set_config("num_fewshot", 0)
    if entry.max_gen_toks is not None and task.OUTPUT_TYPE == "generate_until":
        task.set_config("generation_kwargs", {"max_gen_toks": entry.max_gen_toks}, update=True)
    task.set_fewshot_seed(seed)
    _check_fewshot_pool(leaf, task)


def _fingerprint(task: Any, n: int, data: str, seed: int) -> str:
    """What the task's prompts and documents depend on, hashed: lm-eval's version, the task's
    config, shots, documents scored and the data's checksum (the seed where there are shots)."""
    shots = task.get_config("num_fewshot")
    body = {
        "lm_eval": lm_eval_version(),
        "config": _stable(task.config.to_dict(keep_callable=True)),
        "num_fewshot": shots,
        "n": n,
        "data": data,
    }
    if shots:  # the seed draws the few-shot examples: a 0-shot prompt does not depend on it
        body["fewshot_seed"] = seed
    body["config"].get("metadata", {}).pop("config_source", None)  # where the YAML lived is not content
    body["config"].pop("dataset_kwargs", None)  # local paths: the data is in `data` by content
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_fewshot_pool(leaf: str, task: Any) -> None:
    """k-shot prompts need k examples to draw: past the pool, lm-eval fails in every setup after
    the model loaded ("Sample larger than population"); refuse it here instead."""
    shots = int(task.get_config("num_fewshot") or 0)
    if not shots:
        return
    try:
        pool = task.fewshot_docs()
    except Exception:  # noqa: BLE001 - no few-shot split at all: lm-eval draws from the test docs
        pool = None
    if pool is None:
        pool = task.eval_docs  # lm-eval then samples from the evaluation split (minus the document itself)
        size = len(pool) - 1
    else:
        size = len(pool)
    if shots > size:
        raise UserError(
            f"lm-eval task {leaf}: num_fewshot {shots} is larger than its few-shot pool of {size} documents"
        )


def task_metrics(task: Any) -> list[str]:
    """The metric keys lm-eval reports for a task, `metric,filter` with filter "none" dropped."""
    filters = [f["name"] for f in (task.config.filter_list or [])] or ["none"]
    names = [
        m["metric"] if isinstance(m["metric"], str) else m["metric"].__name__ for m in (task.config.metric_list or [])
    ] or list(task.higher_is_better())
    return [n if f == "none" else f"{n},{f}" for f in filters for n in names]


def _data_sha256(task: Any, docs: list[Any]) -> str:
    """sha256 over the scored documents and the few-shot pool, as JSON: the data by content,
    whether it came from local files or a hub revision."""
    h = hashlib.sha256()
    for doc in docs:
        h.update(json.dumps(doc, sort_keys=True, default=str).encode() + b"\n")
    try:
        pool = task.fewshot_docs()
    except Exception:  # noqa: BLE001 - a task without a few-shot pool (0-shot only)
        pool = None
    for doc in pool or []:
        h.update(b"shot:" + json.dumps(doc, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()


def _callable_content(obj: Any) -> str:
    """A `!function` helper by content: its name, and the sha256 of every Python file beside its
    module (its own source alone misses a module constant it reads, or a helper module it imports)."""
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:  # a builtin: nothing on disk to change
        return name
    # lm-eval names a helper's module by its file path (a temporary copy here): the file's name
    # and content identify it, its folder does not
    name = f"{Path(source or '?').stem}.{getattr(obj, '__qualname__', repr(obj))}"
    if not source or not Path(source).is_file():
        return name
    h = hashlib.sha256()
    for py in sorted(Path(source).parent.glob("*.py")):
        h.update(py.name.encode() + b"\0" + py.read_bytes() + b"\0")
    return f"{name} [module folder sha256 {h.hexdigest()}]"


def _stable(obj: Any) -> Any:
    """JSON-able and the same in every process: callables by their source, no memory addresses."""
    if callable(obj):
        return _callable_content(obj)
    if isinstance(obj, dict):
        return {str(k): _stable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_stable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return _ADDR.sub(">", str(obj))
