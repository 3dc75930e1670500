"""Long-context tasks as ordinary qeval Tasks (`passkey_4096`, `multikey_4096`,
`position_ppl_4096`): generated in memory from the config's seed, sized with the model's
tokenizer, checksummed over their documents; keys, store, comparison and notebook treat them
like any task.

The deployment length is `budget.context_len` when it is one of the lengths, else the longest:
each family's task at that length is a top-level task (gated by `all`, needed for a
recommendation); its other lengths belong to the family (entry = the family's name) and are
gated only where a gate names them (`{task: passkey, length: 2048, max_drop: ...}`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.config.long_context import LongContextSpec
from qeval.errors import UserError
from qeval.tasks.generated import limited_docs, number_answer_spec
from qeval.tasks.long_context.generate import Encode, multikey_doc, passkey_doc, prose_doc
from qeval.tasks.native import Task, TaskSpec

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.config.gates import Gate

#: bump when a generator's output changes: it is part of every task's fingerprint
GENERATOR_VERSION = 1
#: new tokens a passkey / multikey answer may take (5 and 7 digits; some tokenizers split digits)
MAX_GEN = {"passkey": 10, "multikey": 14}


@dataclass
class LongContextTask(Task):
    """A generated task at one length; `buckets` are position_ppl's bucket edges in tokens."""

    family: str = ""
    length: int = 0
    deployment: bool = False
    buckets: list[int] = field(default_factory=list)

    @property
    def entry(self) -> str:
        return self.name if self.deployment else self.family

    @property
    def kind(self) -> str:
        return "long_context"


@dataclass(frozen=True)
class Plan:
    """What a config's `long_context:` resolves to on a model."""

    lengths: list[int]
    deployment_length: int
    model_max: int
    edges: list[int]  # bucket upper edges


def model_max_context(cfg: RunConfig, model_config: dict[str, Any]) -> int:
    """The longest sequence the run can score: `model.max_context`, capped by the model's
    `max_position_embeddings` where config.json has one."""
    inner = model_config.get("text_config", model_config)
    return min(cfg.model.max_context, int(inner.get("max_position_embeddings") or 10**9))


def plan(cfg: RunConfig, model_config: dict[str, Any]) -> Plan:
    """Lengths (default 1/4, 1/2, 1 x budget.context_len, capped at the model's maximum), the
    deployment length and the bucket edges; a length the model cannot score is refused."""
    spec = cfg.long_context
    assert spec is not None
    top = model_max_context(cfg, model_config)
    budget = cfg.budget.context_len
    if spec.lengths:
        too_long = [n for n in spec.lengths if n > top]
        if too_long:
            raise UserError(
                f"long_context.lengths: {too_long[0]} tokens is more than this model scores "
                f"({top}: the smaller of model.max_context and max_position_embeddings)"
            )
        lengths = list(spec.lengths)
    else:
        lengths = sorted({min(max(budget // d, 16), top) for d in (4, 2, 1)})
    deployment = budget if budget in lengths else lengths[-1]
    edges = spec.buckets or sorted({max(lengths[0] // 4, 1), *lengths})
    return Plan(lengths, deployment, top, edges)


def bucket_edges(edges: list[int], length: int) -> list[int]:
    """[0, e1, e2, ..., length]: the bucket boundaries of a document of at most `length` tokens."""
    return [0, *[e for e in edges if e < length], length]


def build_tasks(cfg: RunConfig, model_config: dict[str, Any], encode: Encode) -> list[LongContextTask]:
    """Every long-context task of the config, generated with `encode` (the backends'
    encoding: the tokenizer's own special tokens)."""
    spec = cfg.long_context
    assert spec is not None
    p = plan(cfg, model_config)
    out = []
    for family in spec.tasks:
        for length in p.lengths:
            out.append(_task(spec, family, length, length == p.deployment_length, p.edges, encode, cfg.limit))
    return out


def _task(
    spec: LongContextSpec,
    family: str,
    length: int,
    deployment: bool,
    edges: list[int],
    encode: Encode,
    limit: int | None,
) -> LongContextTask:
    docs = _docs(spec, family, length, encode)
    name = f"{family}_{length}"
    meta = {
        "family": family,
        "length": length,
        "seed": spec.seed,
        "generator": GENERATOR_VERSION,
        "chunk_tokens": spec.chunk_tokens,
    }
    if family == "position_ppl":
        task_spec = TaskSpec(
            task=name,
            output_type="loglikelihood_rolling",
            doc_to_text="text",
            metadata=meta | {"buckets": bucket_edges(edges, length)},
        )
    else:
        task_spec = number_answer_spec(name, MAX_GEN[family], meta)
    docs, digest = limited_docs(docs, limit)
    return LongContextTask(
        spec=task_spec,
        yaml_path=Path(f"<long_context>/{name}"),
        docs=docs,
        sha256=digest,
        family=family,
        length=length,
        deployment=deployment,
        buckets=bucket_edges(edges, length) if family == "position_ppl" else [],
    )


def _docs(spec: LongContextSpec, family: str, length: int, encode: Encode) -> list[dict[str, Any]]:
    """The documents of one (family, length), their needles at the spec's depths in turn."""
    # one stream per (family, length): adding a length or a family leaves the others' documents alone
    rng = random.Random(f"{spec.seed}/{family}/{length}")
    docs: list[dict[str, Any]] = []
    for i in range(spec.samples):
        depth = spec.depths[i % len(spec.depths)]
        if family == "passkey":
            doc = passkey_doc(encode, length - MAX_GEN[family], depth, rng)
        elif family == "multikey":
            doc = multikey_doc(encode, length - MAX_GEN[family], depth, rng, spec.keys)
        else:
            doc = prose_doc(encode, length, rng)
        suffix = f"-d{round(100 * depth):02d}" if family != "position_ppl" else ""
        docs.append({"id": f"{family}-{length}-{i:03d}{suffix}", **doc})
    return docs


def resolve_gates(gates: list[Gate], cfg: RunConfig, p: Plan) -> list[Gate]:
    """Gates on a long-context family become gates on its task at one length: `length: budget`
    (budget.context_len), an integer length, or no length (the deployment length). Any other
    gate is kept as it is."""
    spec = cfg.long_context
    families = list(spec.tasks) if spec else []
    out = []
    for gate in gates:
        if gate.length is None and gate.task not in families:
            out.append(gate)
            continue
        if spec is None:
            raise UserError(f"gate on {gate.task!r} at length {gate.length}: the config has no long_context")
        length = (
            p.deployment_length
            if gate.length is None
            else (cfg.budget.context_len if gate.length == "budget" else gate.length)
        )
        if length not in p.lengths:
            raise UserError(
                f"gate on {gate.task!r} at length {length}: not one of long_context's lengths "
                f"{p.lengths} (capped at the model's {p.model_max} tokens)"
            )
        names = families if gate.task == "all" else [gate.task]
        if any(n not in families for n in names):
            raise UserError(
                f"gate at length {length}: {gate.task!r} is not a long-context task of this config "
                f"({', '.join(families)})"
            )
        out += [gate.model_copy(update={"task": f"{n}_{length}", "length": length}) for n in names]
    return out


def load_tokenizer(path: str, revision: str | None, trust_remote_code: bool) -> Any:
    """The model's tokenizer (a folder, a hub id, or a GGUF file's parent folder)."""
    from transformers import AutoTokenizer

    from qeval.model.source import is_gguf

    kw: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if is_gguf(path):
        kw["gguf_file"] = Path(path).name
        path = str(Path(path).parent)
    tok = AutoTokenizer.from_pretrained(path, **kw)
    tok.model_max_length = 10**9  # documents are sized here, to any length: no "longer than" warning
    return tok


def generated_tasks(cfg: RunConfig, model_config: dict[str, Any]) -> list[LongContextTask]:
    """The config's long-context tasks, the tokenizer loaded here (preflight and worker alike)."""
    from qeval.backends.tokens import conventions

    spec = cfg.model
    tok = load_tokenizer(spec.path, spec.revision, spec.trust_remote_code)
    return build_tasks(cfg, model_config, conventions(tok).encode)
