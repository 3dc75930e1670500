"""results.json's echoes of what qeval was given or found: a setup's spec, what its quantizer
or engine did, the machine, and the resolved run config. Each is typed on the keys qeval reads
back, and keeps every other key as it was written (extra="allow"); each writes back exactly the
keys it was given, so a block that never had a key (a results.json from an older qeval, a config
key left unset) gains no `null` for it, and the config block still hashes as it did
(`run.config_hash`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from qeval.config.chat import CHAT_KEYS
from qeval.results.base import ResultModel


class Echo(ResultModel):
    # No docstring: pydantic would give it to every subclass without one, in the JSON Schema.
    # A typed view over a dict as written: the keys it was given are the keys it writes.

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in out.items() if k in given}

    def as_dict(self) -> dict[str, Any]:
        """The block as results.json holds it (its typed keys and every other key)."""
        return self.model_dump(mode="json")


class SetupSpec(Echo):
    """The setup as configured (config/setups.py `Setup`), with its stable id."""

    id: str | None = Field(None, description="the setup's stable id (config/setups.py)")
    name: str | None = None
    baseline: bool = False
    weights: str | None = Field(None, description="the weights' scheme (int8, int4, ...; null: unquantized)")
    method: str = Field("rtn", description="the weight quantizer's method")
    group_size: int | None = Field(None, description="the weights' quantization group")
    kv_cache: str = Field("auto", description="the KV cache's scheme")
    kv_group_size: int | None = Field(None, description="the KV cache's quantization group")
    kv_residual_length: int = Field(1, description="tokens the quantized KV cache keeps unquantized")
    checkpoint: str | None = Field(None, description="a pre-quantized checkpoint served")
    checkpoint_revision: str | None = Field(None, description="the hub revision of that checkpoint")
    memory_limit_mib: int | None = Field(None, description="the worker's address-space cap")
    optional: bool = Field(False, description="skipped, not refused, where the device cannot run it")
    keep: list[str] = Field([], description="module-name patterns kept at the model's dtype (a mixed setup)")
    kv_keep: list[str] = Field(
        [], description="decoder layers (indices or kinds) whose KV cache stays at the model's dtype; absent: none"
    )
    control: dict[str, int | str] | None = Field(
        None, description="an A/A control's serving conditions (the baseline served again); absent: not a control"
    )

    def served_on(self) -> str | None:
        """An engine-parity control's backend (None: the run's own)."""
        backend = (self.control or {}).get("backend")
        return str(backend) if backend is not None else None

    def conditions(self) -> str:
        """ "batch_size 1": a control's serving conditions in words, its backend left out."""
        return ", ".join(f"{k} {v}" for k, v in (self.control or {}).items() if k not in ("backend", "of"))

    def partner(self) -> str | None:
        """The setup an engine-parity control serves again, where not the baseline (`control.of`)."""
        of = (self.control or {}).get("of")
        return str(of) if of is not None else None


class Provenance(ResultModel):
    """What the engine actually ran for a setup (docs/backends.md, "Kernel provenance")."""

    linear: dict[str, int] = Field(
        {}, description="module type: method / scheme / kernel (vLLM), or its weight's storage (transformers) -> count"
    )
    attention: list[str] = Field([], description="the attention backend(s) or implementation")
    kv_cache: str | None = Field(None, description="what the KV cache held, as the engine was configured")
    kv_scales: str | None = Field(None, description="an FP8 KV cache's scales: unit (1.0) or calibrated; null: none")
    source: str = Field("", description="how it was read")
    fallbacks: list[str] = Field([], description="where the setup ran on another path than its format's own")


class Quantization(Echo):
    """What the quantizer or engine did (library, scheme, kernels); the backend's own keys beside."""

    library: str | None = Field(None, description="the quantizing library and its version")
    checkpoint: str | None = Field(None, description="the pre-quantized checkpoint served, if any")
    description: str | None = Field(None, description="the checkpoint, described from its quantization_config")
    decompressed_to: str | None = Field(None, description="the dtype transformers decompressed a checkpoint to")
    emulated: str | None = Field(
        None,
        description="what ran in software instead of the format's kernels, e.g. a decompressed checkpoint's "
        "activations rounded to FP8 per token in bf16 (null: nothing emulated)",
    )
    engine_kernels: dict[str, str] = Field({}, description="scheme -> the linear kernel the engine chose")
    provenance: Provenance | None = Field(None, description="what the engine ran (null: results written before it)")

    def emulated_parts(self) -> dict[str, str]:
        """What of the setup ran in software, `activations` and / or `KV cache`, each with its
        description (`emulated` holds them joined by "; ", as the backend wrote them)."""
        parts = [p for p in (self.emulated or "").split("; ") if p]
        return {("KV cache" if p.startswith("KV cache") else "activations"): p for p in parts}


class Hardware(Echo):
    """The machine the run ran on (records/provenance.py `hardware`)."""

    machine: str | None = Field(None, description="platform.machine()")
    processor: str | None = Field(None, description="platform.processor()")
    cpus: int | None = Field(None, description="os.cpu_count()")
    python: str | None = Field(None, description="the Python version")
    platform: str | None = Field(None, description="platform.platform()")


class ModelEcho(Echo):
    """The config's `model:` block, model.dtype resolved."""

    path: str = Field(description="the model folder or hub id as configured")
    dtype: str | None = Field(None, description="the dtype the setups computed in")
    max_context: int | None = Field(None, description="the longest sequence scored")
    revision: str | None = Field(None, description="the hub revision of a hub-id model")


class BudgetEcho(Echo):
    """The config's `budget:` block (overhead and margin absent from results written before them)."""

    gpu_memory_gib: float = Field(description="the device's memory, GiB")
    utilization: float = Field(description="the share of it the engine may use")
    context_len: int = Field(description="tokens per sequence the capacity is counted at")
    overhead_gib: float | None = Field(None, description="the runtime's own memory, GiB")
    margin: float | None = Field(None, description="the fragmentation margin, a share")


class ConfigEcho(Echo):
    """The resolved run config (config/run.py `RunConfig.as_json`, model.dtype resolved): the keys
    qeval reads back typed, the rest as written."""

    name: str | None = None
    model: ModelEcho = Field(description="the model block")
    backend: str | None = None
    budget: BudgetEcho = Field(description="the memory budget")
    batch_size: int | None = Field(None, description="sequences per forward pass")
    generation_batch_size: int | None = Field(None, description="sequences per generation batch (null: 4 x batch_size)")
    seed: int | None = Field(None, description="the run's seed")
    candidate: str | None = Field(None, description="the setup a release pipeline ships (null: the recommended)")
    recommend_by: str = Field("concurrency", description="what the recommendation ranks passing setups by")
    lm_eval: dict[str, Any] | None = Field(None, description="the lm_eval block")
    workload: dict[str, Any] | None = Field(None, description="the workload block")
    chat_template: bool | str | None = Field(None, description="the run's chat template key")
    system_prompt: str | None = Field(None, description="the run's system prompt")
    fewshot_as_multiturn: bool | None = Field(None, description="few-shot examples as turns")
    think_end_token: str | None = Field(None, description="a generation is scored after this string")

    def chat_keys(self) -> dict[str, Any]:
        """The run-level chat keys (config/chat.py `CHAT_KEYS`), None where unset."""
        return {k: getattr(self, k) for k in CHAT_KEYS}
