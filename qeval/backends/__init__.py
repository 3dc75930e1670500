"""The backend registry: each backend is one folder that provides one `BackendEntry` (its
`entry.py`), and preflight, the runner, the worker, assembly and the performance phase reach
it through `backend_entry(name)`, never by testing the name. The backends qeval ships:

    hf      transformers, in the worker's process             qeval/backends/hf/entry.py
    vllm    vLLM's engine, in the worker's process             qeval/backends/vllm/entry.py
    openai  an OpenAI-compatible server, attached or launched  qeval/backends/openai/entry.py

A backend outside qeval registers without changing qeval, as a task kind does
(qeval/tasks/kinds.py): through the entry-point group `qeval.backends` (an installed package), or
the `QEVAL_BACKENDS` environment variable (`module:attribute`, comma-separated; the worker
processes inherit it). `backend: <name>` in the run config then selects it.

Importing this is cheap, and so is every entry module: an entry imports its engine only inside
`create` (and whatever else needs it), when called.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from qeval.errors import UserError
from qeval.plugins import load_registry

if TYPE_CHECKING:
    from qeval.backends.base import Backend, ServingEngine
    from qeval.config import RunConfig
    from qeval.config.setups import Setup
    from qeval.memory.layouts import KvRule
    from qeval.records.preflight import Preflight

#: the backends qeval ships: `module:attribute`
BUILT_IN = (
    "qeval.backends.hf.entry:BACKEND",
    "qeval.backends.vllm.entry:BACKEND",
    "qeval.backends.openai.entry:BACKEND",
)
ENTRY_POINT_GROUP = "qeval.backends"
ENV_VAR = "QEVAL_BACKENDS"


@dataclass(frozen=True)
class BackendEntry:
    """What qeval needs to know of one backend."""

    name: str
    #: raise a one-line UserError for a setup this backend cannot run on the device; loads nothing
    validate_setup: Callable[[Setup, str], None]
    #: raise a one-line UserError when the engine is not installed where the workers run
    check_install: Callable[[RunConfig], None]
    #: the interpreter a setup's worker process runs in
    worker_python: Callable[[RunConfig], str]
    #: the engine, inside the worker: one instance serves one setup
    create: Callable[[RunConfig, Setup, str], Backend]
    #: raise a one-line UserError for a setup this model's config.json rules out on this backend
    #: and device
    validate_model: Callable[[Setup, dict[str, Any], str], None] = lambda setup, config, device: None
    #: resume-key parts of this backend beyond the common ones (settings that change its numbers)
    key_parts: Callable[[RunConfig], dict[str, str]] = lambda cfg: {}
    #: whether setups of the `qeval quantize` methods (w8a8, w4a8, gptq, awq) are served from its
    #: checkpoints (both backends: vLLM's kernels, transformers' compressed-tensors quantizer)
    serves_checkpoints: bool = False
    #: how the engine spreads one setup over several devices: None (one device, or qeval's own
    #: worker drives them: "mp"), or "ray" (the engine places its own workers on the cluster)
    distributed: Callable[[RunConfig], str | None] = lambda cfg: None
    #: raise a one-line UserError for a task the backend cannot score (its tasks expanded, before any
    #: setup runs): an attached server that refuses prompt log-probabilities refuses likelihood tasks
    validate_tasks: Callable[[Preflight], None] = lambda pre: None
    #: as validate_setup, where the answer depends on the config too (how the openai backend's
    #: server is started: a launched vLLM refuses what the in-process engine refuses)
    validate_served: Callable[[RunConfig, Setup, str], None] = lambda cfg, setup, device: None
    #: whose rules size one sequence's KV cache on this device (qeval/memory/layouts.py), for the
    #: memory block's `kv_per_sequence` and the capacity of models whose layers keep different
    #: spans; None where qeval cannot know the engine (no sequence is then predicted)
    kv_accounting: Callable[[RunConfig, str], KvRule | None] = lambda cfg, device: None
    #: the accounting `qeval plan --engine NAME` assumes, at its --block-size and --max-num-batched-tokens
    #: (the engine serving on a GPU); None: `qeval plan` does not plan for it
    plan_kv_rule: Callable[[int, int], KvRule] | None = None
    #: how `qeval goodput` and the serving phase serve its setups on the workload (qeval/perf/serving.py
    #: drives it; `ServingEngine.serves` says for which configs); None: it has no server to tune
    serving: ServingEngine | None = None
    #: whether the config's `server:` block (an OpenAI-compatible server, attached or launched) is its
    takes_server: bool = False
    #: whether its performance waves can take the workload's request lengths (`performance.from_workload`)
    waves_from_workload: bool = False
    #: quantize a model this backend loaded (its `create`) in place, as the engine serves the setup's
    #: weights; what was done. The advisor's sensitivity probe (qeval/advise/sensitivity.py) uses it
    quantize_weights: Callable[[Any, Setup], dict[str, Any]] | None = None
    #: a fresh KV cache for one forward pass of a model this backend loaded (its config), quantized
    #: as the setup asks, its kept layers (`kv_keep`) not: the KV advisor's probe (qeval/advise/kv.py)
    kv_cache_for: Callable[[Any, Setup], Any] | None = None
    #: where setups' formats run on this engine by device class, as `qeval validate --placement`
    #: prints it (qeval/backends/vllm/placement.py); None: the engine places nothing
    placement_lines: Callable[[list[Setup]], list[str]] | None = None
    #: the serving conditions an A/A control may change on this engine (`config.setups.Control`'s
    #: fields: batch_size, max_num_seqs, concurrency); a control naming another is refused
    control_fields: frozenset[str] = frozenset()
    #: whether its engine takes `engine.batch_invariant` (vLLM's batch-invariant mode)
    batch_invariant_mode: bool = False


def check_control(entry: BackendEntry, setup: Setup) -> None:
    """One line where `setup` is an A/A control asking for a condition its backend does not have."""
    if setup.control is None:
        return
    other = sorted(set(setup.control.conditions()) - entry.control_fields)
    if other:
        has = ", ".join(sorted(entry.control_fields)) or "none"
        raise UserError(
            f"setup {setup.name}: control {other[0]}: backend {entry.name} has no such serving condition "
            f"(its controls: {has})"
        )


@cache
def _registered(env: str) -> dict[str, BackendEntry]:
    return load_registry(BUILT_IN, ENTRY_POINT_GROUP, env, "backend", "BACKEND", BackendEntry)


def backends() -> dict[str, BackendEntry]:
    """Every registered backend by name: qeval's own, then the installed and the environment's."""
    return _registered(os.environ.get(ENV_VAR, ""))


def check_blocks(cfg: RunConfig) -> None:
    """The config's backend-specific blocks against its backend's entry: a block the backend
    would ignore without a word is one line instead."""
    entry = backend_entry(cfg.backend)
    # an engine-parity control on a server backend takes the server block too
    served = [backend_entry(cfg.backend_of(s)) for s in cfg.setups]
    if cfg.server is not None and not any(e.takes_server for e in served):
        takers = ", ".join(n for n, e in backends().items() if e.takes_server)
        raise UserError(f"server: applies to backend {takers} only (this config's backend is {cfg.backend})")
    if cfg.engine.batch_invariant and not entry.batch_invariant_mode:
        takers = ", ".join(n for n, e in backends().items() if e.batch_invariant_mode)
        raise UserError(
            f"engine.batch_invariant applies to backend {takers} only (this config's backend is {cfg.backend})"
        )
    if cfg.performance.enabled and cfg.performance.from_workload and not entry.waves_from_workload:
        raise UserError(
            f"performance.from_workload: backend {cfg.backend} does not time waves of the workload's lengths "
            "(on vllm the workload is served by the serving phase: recommend_by goodput, or qeval goodput)"
        )


def serving_engine(cfg: RunConfig) -> ServingEngine | None:
    """The engine that serves `cfg`'s setups on its workload (`BackendEntry.serving`), None where
    its backend, or its backend as this config sets it up, has no server qeval can tune."""
    serving = backend_entry(cfg.backend).serving
    return serving if serving is not None and serving.serves(cfg) else None


def plan_kv_rule(engine: str, block_size: int, in_flight_tokens: int) -> KvRule:
    """The KV accounting `qeval plan --engine` names (`BackendEntry.plan_kv_rule`); one line
    naming the engines it may name where it names another."""
    planned = {n: e.plan_kv_rule for n, e in backends().items() if e.plan_kv_rule is not None}
    rule = planned.get(engine)
    if rule is None:
        raise UserError(f"--engine {engine}: expected {' or '.join(sorted(planned, reverse=True))}")
    return rule(block_size, in_flight_tokens)


def backend_entry(name: str) -> BackendEntry:
    """The registry entry of a backend; one line naming the registered ones if there is none."""
    registered = backends()
    if name not in registered:
        raise UserError(f"backend: {name!r} is not a backend qeval has (registered: {', '.join(registered)})")
    return registered[name]
