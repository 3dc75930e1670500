"""A quantization setup: what precision the weights and the KV cache are served at."""

from __future__ import annotations

import hashlib
import json
import re
from fnmatch import fnmatch
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from qeval.files.names import NAME_PATTERN
from qeval.strict import check_int_bound

Weights = Literal["bf16", "fp16", "fp32", "fp8", "fp4", "int8", "int4"]
KVCache = Literal[
    "auto", "fp8", "fp8_e5m2", "int8", "int4", "int2", "fp8_per_token_head", "nvfp4", "turboquant_k8v4",
    "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
]  # fmt: skip
Method = Literal[
    "rtn", "bnb", "torchao", "w8a8", "w4a8", "gptq", "awq", "fp8_dynamic", "fp8_static", "nvfp4", "nvfp4a16", "mxfp4",
    "mxfp4a16",
]  # fmt: skip

#: bits per weight element for each weight precision (scales are added by memory/ledger.py)
WEIGHT_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "fp4": 4, "int8": 8, "int4": 4}
#: the weight precisions a setup quantizes to (the rest are the model's own floating dtypes)
QUANTIZED_WEIGHTS = ("fp8", "fp4", "int8", "int4")
#: method -> the weights of the checkpoint `qeval quantize` makes for it (llm-compressor's recipe
#: for each: quantize/checkpoints.py SCHEMES); every backend that serves checkpoints reads this
CHECKPOINT_WEIGHTS: dict[str, str] = {
    "w8a8": "int8",
    "w4a8": "int4",
    "gptq": "int4",
    "awq": "int4",
    "fp8_dynamic": "fp8",
    "fp8_static": "fp8",
    "nvfp4": "fp4",
    "nvfp4a16": "fp4",
    "mxfp4": "fp4",
    "mxfp4a16": "fp4",
}
#: vLLM 0.32's TurboQuant KV presets (model_executor/layers/quantization/turboquant/config.py
#: TQ_PRESETS): key bits (8: an FP8 cast; 3-4: a Lloyd-Max codebook after a Hadamard rotation),
#: value bits (uniform, a scale and zero point per token and head), and the key norm correction
TURBOQUANT: dict[str, tuple[int, int, bool]] = {
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}
#: bits per KV element for each KV-cache precision; `auto` follows the model dtype
KV_BITS: dict[str, int] = {
    "fp8": 8,
    "fp8_e5m2": 8,
    "int8": 8,
    "int4": 4,
    "int2": 2,
    "fp8_per_token_head": 8,  # vLLM 0.32's own formats, by its names: an FP8 scale per token and head
    "nvfp4": 4,  # E2M1 values with an FP8 scale per 16 (Blackwell)
    # vLLM 0.32's TurboQuant caches: the mean of the key's and the value's bits, rounded down (the
    # ledger counts their slots exactly: memory/ledger.py)
    **{kind: (key + value) // 2 for kind, (key, value, _) in TURBOQUANT.items()},
}
#: TurboQuant keeps the first and last few decoder layers' KV at 16 bits on a dense model (vLLM 0.32
#: TurboQuantConfig.get_boundary_skip_layers: min(2, layers // 2) each side; none on a hybrid)
TURBOQUANT_BOUNDARY = 2
#: the layer kinds `kv_keep` names (ModelShape.kinds' words for the attention layers)
KV_KINDS = ("full", "sliding", "chunked")
_KEEP_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]-]{1,200}")


class Control(BaseModel):
    """The serving conditions an A/A control changes (docs/statistics.md, "The noise floor"): the
    baseline scored again under conditions that must not change its answers. Each backend honours
    the fields its engine has (`BackendEntry.control_fields`): transformers the batch size, vLLM the
    scheduler's max_num_seqs, the openai backend the requests in flight."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    #: sequences per forward pass (the hf backend; generation batches follow at 4 x, as the run's do)
    batch_size: int | None = Field(default=None, gt=0, le=4096)
    #: the vLLM scheduler's max_num_seqs: how many sequences share a step
    max_num_seqs: int | None = Field(default=None, gt=0, le=4096)
    #: the vLLM scheduler's max_num_batched_tokens: the chunk a long prompt is prefilled in
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=1_048_576)
    #: requests in flight at once (the openai backend's server.concurrency)
    concurrency: int | None = Field(default=None, gt=0, le=256)
    #: engine parity: the baseline served on this backend instead of the run's (hf, vllm, openai),
    #: under the conditions above where given; its difference is the engines', not noise
    backend: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)
    #: engine parity of a setup other than the baseline (a W8A8 checkpoint, say): that setup, by
    #: name, served on `backend`; the control is paired with it instead of with the baseline
    of: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)

    @model_validator(mode="after")
    def _some(self) -> Control:
        if not self.fields():
            raise ValueError(
                "control: names no serving condition (batch_size, max_num_seqs, max_num_batched_tokens, concurrency "
                "or backend)"
            )
        if self.of is not None and self.backend is None:
            raise ValueError(
                f"control: of {self.of} serves that setup again on another engine (parity); it needs a backend"
            )
        return self

    def fields(self) -> dict[str, int | str]:
        """What the control sets, by name (its backend included)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def conditions(self) -> dict[str, int]:
        """The serving conditions it sets (its backend and partner left out): each a field of the backend it runs on."""
        return {k: v for k, v in self.model_dump().items() if v is not None and k not in ("backend", "of")}

    def describe(self) -> str:
        """ "batch_size 1": what the control changed, in words."""
        return ", ".join(f"{k} {v}" for k, v in self.fields().items())


class Setup(BaseModel):
    """One way of serving the model. `weights` None means the model's own 16-bit dtype."""

    # strict as every config model (qeval/strict.py): `baseline: "yes"` is refused, not read as true
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = Field(pattern=NAME_PATTERN)
    baseline: bool = False
    weights: Weights | None = None
    method: Method = "rtn"
    group_size: int | None = Field(default=None, gt=0)
    kv_cache: KVCache = "auto"
    kv_group_size: int | None = Field(default=None, gt=0)
    #: tokens QuantizedCache keeps unquantized; 1 quantizes everything (see backends/hf/kv_cache.py)
    kv_residual_length: int = Field(default=1, ge=1)
    #: a quantized checkpoint folder (vllm backend: W8A8 / W4A8 / GPTQ / AWQ from `qeval quantize`)
    checkpoint: str | None = None
    #: the hub revision (branch, tag or commit) of a hub-id `checkpoint`: pins its contents, as
    #: `model.revision` pins the model's (a local folder has none)
    checkpoint_revision: str | None = Field(default=None, min_length=1, max_length=200)
    #: cap the worker's address space (MiB): reproduces an out-of-memory on a smaller device
    memory_limit_mib: int | None = Field(default=None, gt=0)
    #: where the backend cannot run this setup on this device, skip it (reported) instead of
    #: refusing the config: one config then serves machines of different abilities
    optional: bool = False
    #: module-name patterns (shell-style wildcards, as fnmatch) of linear layers kept at the
    #: model's own dtype while the rest are quantized: a mixed-precision setup (docs/advisor.md)
    keep: tuple[str, ...] = ()
    #: an A/A control: the baseline's setup (the same weights and KV cache) served under other
    #: conditions, paired with the baseline like any setup; its flips and KL are the engine's own
    #: noise, shown beside every gate, and it is never recommended (docs/statistics.md)
    control: Control | None = None
    #: decoder layers whose KV cache stays at the model's dtype while the rest are quantized
    #: (`kv_cache`): layer indices (0 first) or layer kinds (full, sliding, chunked); vLLM serves it
    #: with --kv-cache-dtype-skip-layers, transformers with a per-layer cache (docs/memory.md)
    kv_keep: tuple[str, ...] = ()

    @field_validator("*", mode="after")
    @classmethod
    def _int_bound(cls, value: object) -> object:
        return check_int_bound(value)  # as every config model (qeval/strict.py)

    @field_validator("keep", mode="before")
    @classmethod
    def _keep(cls, value: object) -> object:
        # a YAML list arrives as a list; strict mode takes only a tuple
        if isinstance(value, list):
            value = tuple(value)
        if isinstance(value, tuple):
            for pattern in value:
                if not isinstance(pattern, str) or not _KEEP_PATTERN.fullmatch(pattern):
                    raise ValueError(
                        f"keep pattern {pattern!r} is not a module-name pattern "
                        "(letters, digits, . _ - and the wildcards * ? [ ])"
                    )
            value = tuple(sorted(set(value)))  # order and repeats do not change the setup
        return value

    @field_validator("kv_keep", mode="before")
    @classmethod
    def _kv_keep(cls, value: object) -> object:
        # YAML gives a list of ints and words; strict mode takes a tuple of strings
        if isinstance(value, list | tuple):
            out = []
            for item in value:
                text = str(item) if isinstance(item, int) and not isinstance(item, bool) else item
                if not isinstance(text, str) or not (text in KV_KINDS or (text.isdigit() and len(text) <= 6)):
                    raise ValueError(
                        f"kv_keep entry {item!r} is neither a layer index (0, 1, ...) nor a layer kind "
                        f"({', '.join(KV_KINDS)})"
                    )
                out.append(str(int(text)) if text.isdigit() else text)
            # order and repeats do not change the setup
            value = tuple(sorted(set(out), key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x)))
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _archived(cls, value: object) -> object:
        archived = ("autogptq", "auto_gptq", "autoawq", "auto_awq")
        if isinstance(value, str) and value.lower().replace("-", "_") in archived:
            raise ValueError(
                f"{value} is archived upstream and not offered; method gptq or awq makes those "
                "checkpoints with llm-compressor (`qeval quantize`)"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> Setup:
        quantized = self.quantizes_weights
        if self.group_size is not None and (
            self.weights != "int4" or self.method not in ("rtn", "gptq", "awq", "w4a8")
        ):
            raise ValueError(f"setup {self.name}: group_size applies to int4 weights only (fp4 formats fix theirs)")
        if not quantized and self.method != "rtn":
            raise ValueError(
                f"setup {self.name}: method {self.method!r} needs quantized weights (int8, int4, fp8, fp4)"
            )
        made = CHECKPOINT_WEIGHTS.get(self.method)
        if made is not None and quantized and made != self.weights:
            raise ValueError(f"setup {self.name}: method {self.method} makes {made} weights, not {self.weights}")
        if self.weights == "fp4" and made is None:
            raise ValueError(
                f"setup {self.name}: fp4 weights come from a checkpoint: method nvfp4, nvfp4a16, mxfp4 or mxfp4a16"
            )
        if self.checkpoint_revision is not None and self.checkpoint is None:
            raise ValueError(f"setup {self.name}: checkpoint_revision needs a checkpoint (a hub id) to pin")
        if self.keep and not quantized:
            raise ValueError(f"setup {self.name}: keep needs quantized weights (something to keep layers from)")
        if self.kv_keep and not self.quantizes_kv:
            raise ValueError(f"setup {self.name}: kv_keep needs a quantized kv_cache (layers to keep from)")
        if self.control is not None and self.baseline:
            raise ValueError(f"setup {self.name}: a control is the baseline served again; it cannot be the baseline")
        if self.keep and self.method in ("bnb", "torchao"):
            raise ValueError(
                f"setup {self.name}: keep is served by quanto (method rtn) or by an llm-compressor "
                f"checkpoint (gptq, awq, w8a8, w4a8), not by {self.method}"
            )
        return self

    @property
    def parity(self) -> bool:
        """Whether this setup is an engine-parity control: the baseline on another backend."""
        return self.control is not None and self.control.backend is not None

    def serves_as(self, other: Setup) -> bool:
        """Whether this setup serves the same model as `other`: the same weights, KV cache and
        checkpoint (what an A/A control must share with the baseline)."""
        fields: tuple[str, ...] = ("weights", "method", "group_size", "kv_cache", "kv_group_size")
        fields += ("kv_residual_length", "checkpoint", "checkpoint_revision", "keep", "kv_keep")
        return all(getattr(self, f) == getattr(other, f) for f in fields)

    @property
    def quantizes_weights(self) -> bool:
        return self.weights in QUANTIZED_WEIGHTS

    @property
    def quantizes_kv(self) -> bool:
        return self.kv_cache != "auto"

    def weights_key(self) -> tuple[str | None, str, int | None, tuple[str, ...]]:
        """What identifies this setup's weights: two setups with the same key serve the same
        weights (a KV-cache setup's weights-only twin has its key and KV auto)."""
        return (self.weights, self.method, self.group_size, self.keep)

    def kv_kept_layers(self, kinds: tuple[str, ...]) -> tuple[int, ...]:
        """The decoder layers (indices) whose KV cache stays at the model's dtype, for a model whose
        layers are of `kinds` (ModelShape.kinds: full, sliding, chunked, linear): the `kv_keep`
        entries, and a TurboQuant cache's boundary layers (`boundary_kept_layers`)."""
        boundary = set(self.boundary_kept_layers(kinds))
        return tuple(i for i, k in enumerate(kinds) if str(i) in self.kv_keep or k in self.kv_keep or i in boundary)

    def boundary_kept_layers(self, kinds: tuple[str, ...]) -> tuple[int, ...]:
        """The layers vLLM keeps at 16 bits under a TurboQuant cache whatever the setup says: the
        first and last min(2, layers // 2) of a dense model; none on a hybrid (state layers)."""
        if self.kv_cache not in TURBOQUANT or "linear" in kinds:
            return ()
        n = min(TURBOQUANT_BOUNDARY, len(kinds) // 2)
        return tuple(sorted({*range(n), *range(len(kinds) - n, len(kinds))}))

    def kv_keep_problem(self, kinds: tuple[str, ...]) -> str:
        """Why this setup's `kv_keep` cannot be served on a model whose layers are of `kinds`, else
        '': an index past the last layer, a kind the model has none of, a state layer (it holds no
        K/V), or every attention layer kept (the baseline's cache under a quantized label)."""
        if self.kv_cache in TURBOQUANT:
            # vLLM 0.32's TurboQuant attention stores a layer's window but does not hand it to its
            # kernels (v1/attention/backends/turboquant_attn.py, read, not run): such a layer would
            # attend to every token, which neither qeval's emulation nor its memory plan shows
            kept = set(self.kv_kept_layers(kinds))
            if windowed := [i for i, k in enumerate(kinds) if k in ("sliding", "chunked") and i not in kept]:
                return (
                    f"setup {self.name}: {self.kv_cache} on a model with sliding-window or chunked layers "
                    f"({len(windowed)} not kept): vLLM's TurboQuant attention does not apply their window; keep "
                    "them (kv_keep: [sliding]) or use another KV format"
                )
        if not self.kv_keep and not self.boundary_kept_layers(kinds):
            return ""
        where = f"setup {self.name}: kv_keep"
        for entry in self.kv_keep:
            if entry.isdigit() and int(entry) >= len(kinds):
                return f"{where} {entry}: the model has {len(kinds)} layers (0 to {len(kinds) - 1})"
            if entry.isdigit() and kinds[int(entry)] == "linear":
                return f"{where} {entry}: layer {entry} is a linear-attention layer: it holds a state, no K/V to keep"
            if not entry.isdigit() and entry not in kinds:
                return f"{where} {entry}: the model has no {entry}-attention layer ({', '.join(sorted(set(kinds)))})"
        attention = [i for i, k in enumerate(kinds) if k != "linear"]
        if set(attention) <= set(self.kv_kept_layers(kinds)):
            if self.boundary_kept_layers(kinds):
                return (
                    f"setup {self.name}: {self.kv_cache} keeps the first and last {TURBOQUANT_BOUNDARY} layers at 16 "
                    f"bits (vLLM's boundary layers), which{' with kv_keep' if self.kv_keep else ''} is every layer "
                    f"of this {len(kinds)}-layer model: nothing would be quantized"
                )
            return f"{where} keeps every attention layer: nothing would be quantized; keep fewer layers"
        return ""

    def keeps(self, module_name: str) -> bool:
        """Whether the linear layer `module_name` stays at the model's dtype (matches a keep pattern)."""
        return any(fnmatch(module_name, pattern) for pattern in self.keep)

    def keep_problem(self, module_names: list[str]) -> str:
        """Why this setup's `keep` list cannot be served over a model whose decoder linear layers
        are `module_names`, else '': no pattern matches a layer (the setup would be plain uniform
        quantization under a mixed label; vLLM's checkpoints are refused the same way), or every
        layer is kept (nothing quantized: the model's own weights under a quantized label)."""
        if not self.keep or not module_names:
            return ""
        kept = [n for n in module_names if self.keeps(n)]
        if not kept:
            return (
                f"setup {self.name}: no keep pattern matches a linear layer of this model "
                f"(names look like {module_names[0]})"
            )
        if len(kept) == len(module_names):
            return (
                f"setup {self.name}: keep matches every linear layer of this model ({len(kept)}): nothing "
                f"would be quantized: the baseline labelled {self.weights}; keep fewer layers"
            )
        return ""

    @property
    def id(self) -> str:
        """Stable cache key: a hash of everything that changes the setup's outputs."""
        fields = self.model_dump(exclude={"name", "baseline", "memory_limit_mib", "optional"})
        if not self.keep:  # a setup without keep has the id it had before keep existed
            del fields["keep"]
        if self.checkpoint_revision is None:  # likewise for a setup that pins no checkpoint revision
            del fields["checkpoint_revision"]
        if not self.kv_keep:  # and for one that keeps no layer's KV cache
            del fields["kv_keep"]
        if self.control is None:  # and for one that is no control
            del fields["control"]
        else:  # a control's conditions as given: a condition added later leaves its id as it was
            fields["control"] = self.control.fields()
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
