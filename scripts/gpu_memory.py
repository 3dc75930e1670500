"""The memory story of scripts/gpu_run.py: a public architecture built from its config.json with
random weights directly on the device, served as qeval's transformers backend serves a setup (its
weight quantizer, qeval/backends/hf/quant.py; its KV caches, qeval/backends/hf/kv_cache.py), and
each resident measured beside qeval's own prediction (qeval/memory/ledger.py, layouts.py) and the
concurrency the one capacity formula allows (qeval/memory/capacity.py) beside the concurrency that
fit before an out-of-memory error.

Memory does not depend on the weights' values, so random weights give real figures; what they
score means nothing. Per setup (weights x KV cache) and context L:

- weights: bytes of the loaded tensors (ledger.model_weights_bytes) and the allocator's growth
  over the build and quantization;
- one sequence: a prefill of L - 1 random tokens and one decode step into the setup's own cache:
  the storage that cache pins (ledger.cache_storage_bytes) and the activation peak above it;
- the concurrency search: B sequences' caches filled at L - 1 tokens with random K/V through the
  cache's own `update` (a quantized cache quantizes them as it would a prefill's), then one batched
  decode step over all B rows, as serving them would run; B grows from the formula's figure until a
  step runs out of memory, then is bisected. What fit, the KV pool it held, the step's activation
  peak, the allocator's slack and the runtime's own memory (NVML's count past torch's reserved
  pool: CUDA context, cuBLAS workspaces) are recorded at the largest B that fit.

On CUDA the device is the GPU (torch.cuda's counters, NVML), and a batch fits when the allocator
did not run out. On CPU (`--device cpu`, the test's path) the "device" is a simulated one of
`capacity` bytes: RSS stands for the allocator's counters (VmHWM, reset through clear_refs, for
its peak), and a batch fits when the weights and the trial's peak RSS growth (at least its KV
pool) fit the capacity (`Meter.admit`). RSS undercounts memory reused inside the heap, so CPU figures are a smoke test
of the path, not measurements to quote.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from qeval.backends.hf import kv_cache
from qeval.backends.hf import quant as hf_quant
from qeval.backends.hf.kv_rule import HeldKv
from qeval.config.setups import Setup
from qeval.memory.capacity import GIB, Budget, kv_capacity
from qeval.memory.layouts import predict_sequence
from qeval.memory.ledger import (
    cache_bytes,
    cache_storage_bytes,
    predict_kv_bytes_per_token,
    predict_weights_bytes,
)
from qeval.model.shape import ModelShape

#: qeval's defaults for a budget (qeval/config/budget.py): the formula a run and `qeval plan` apply
DEFAULT_BUDGET = {"utilization": 0.9, "overhead_gib": 1.0, "margin": 0.05}
#: the formula with nothing held back: every byte past the weights is KV (the theoretical concurrency)
RAW_BUDGET = {"utilization": 1.0, "overhead_gib": 0.0, "margin": 0.0}
#: the public architectures' model types, where a trimmed config.json (tests/data) leaves it out
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_OOM_SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory")

SOURCES = {
    "weights_measured": "sum of the loaded tensors' bytes (qeval.memory.ledger.model_weights_bytes: quantized data, "
    "scales, zero points; tied weights once)",
    "weights_allocator": "allocator growth over building and quantizing the model (CUDA: torch.cuda.memory_allocated;"
    " CPU: RSS)",
    "sequence_kv": "storage the setup's own cache pins after a prefill of L - 1 random tokens and one decode step "
    "(qeval.memory.ledger.cache_storage_bytes)",
    "prefill_activations": "peak over the loaded model during that prefill and step, less the sequence's KV storage "
    "(CUDA: torch.cuda.max_memory_allocated; CPU: VmHWM after clear_refs)",
    "kv_pool": "storage the caches of the largest batch that fit pin (cache_storage_bytes) after the decode step, "
    "filled at L - 1 tokens through each cache's own update (kv_pool_after_fill_bytes: before the step)",
    "step_activations": "peak of the batched decode step over what was allocated before it (the pool and weights)",
    "allocator_slack": "torch.cuda.max_memory_reserved - max_memory_allocated over the step (fragmentation and "
    "rounding in the caching allocator)",
    "runtime_overhead": "NVML's used memory at the step's end, less that before this process used the GPU, less "
    "torch's reserved pool: the CUDA context, cuBLAS workspaces and what else the runtime holds",
}


def is_oom(exc: BaseException) -> bool:
    """An allocation failure: CUDA's OutOfMemoryError, MemoryError, or torch's CPU allocator refusing."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _OOM_SIGNS)


class Meter:
    """Device memory as this script reads it (the module docstring says what stands for what on CPU)."""

    def __init__(self, device: str, capacity_bytes: int | None = None, nvml_baseline: int | None = None) -> None:
        """`nvml_baseline`: NVML's used memory before this process made its CUDA context (read
        now where not given, which is right only before the first CUDA call)."""
        self.device = device
        self.capacity: int
        self._nvml: Any = None
        self.nvml_baseline: int | None = None
        if device == "cuda":
            self._nvml = _nvml_handle()
            self.nvml_baseline = nvml_baseline if nvml_baseline is not None else self.nvml_used()
            torch.cuda.init()
            self.capacity = int(torch.cuda.mem_get_info()[1])
        else:
            if capacity_bytes is None:
                raise ValueError("a CPU meter needs the simulated device's capacity")
            self.capacity = capacity_bytes

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def clean(self) -> None:
        """Free what is unreferenced: Python's garbage, and CUDA's cached blocks."""
        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        else:
            with contextlib.suppress(OSError):  # Linux: 5 resets VmHWM, the peak RSS
                Path("/proc/self/clear_refs").write_text("5")

    def allocated(self) -> int:
        if self.device == "cuda":
            return int(torch.cuda.memory_allocated())
        return _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        if self.device == "cuda":
            return int(torch.cuda.max_memory_allocated())
        return _status_kib("VmHWM") * 1024

    def reserved(self) -> int | None:
        return int(torch.cuda.memory_reserved()) if self.device == "cuda" else None

    def reserved_peak(self) -> int | None:
        return int(torch.cuda.max_memory_reserved()) if self.device == "cuda" else None

    def nvml_used(self) -> int | None:
        """NVML's used memory of the whole device (None off CUDA or where NVML is unreadable)."""
        if self._nvml is None:
            return None
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used)
        except pynvml.NVMLError:
            return None

    def runtime_overhead(self) -> int | None:
        """NVML's count past the baseline, less torch's reserved pool (SOURCES["runtime_overhead"])."""
        used, reserved = self.nvml_used(), self.reserved()
        if used is None or reserved is None or self.nvml_baseline is None:
            return None
        return used - self.nvml_baseline - reserved

    def admit(self, resident: int, trial: dict[str, Any]) -> None:
        """On CPU, refuse (MemoryError) a trial whose peak over its start, on top of `resident`
        bytes (the weights), passes the simulated device's capacity: the allocation a device of
        that size would have refused. On CUDA the GPU's own allocator has already decided."""
        if self.device == "cuda":
            return
        growth = max(trial["fill_peak_bytes"], trial["step_peak_bytes"]) - trial["start_allocated"]
        # RSS misses heap reuse; the pool is exact
        used = resident + max(growth, trial["kv_pool_bytes"], trial["kv_pool_after_fill_bytes"])
        if used > self.capacity:
            raise MemoryError(f"simulated device: {used:,} bytes past its capacity of {self.capacity:,}")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def nvml_used_now() -> int | None:
    """NVML's used memory of device 0 now (None without NVML): read before any CUDA call, the
    baseline the runtime overhead is counted from."""
    handle = _nvml_handle()
    if handle is None:
        return None
    import pynvml

    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except pynvml.NVMLError:
        return None


def _nvml_handle() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - no NVML (or no nvidia-ml-py): the runtime overhead is then not measured
        return None


def model_config(path: Path, shrink: bool = False, max_context: int = 4096) -> dict[str, Any]:
    """A config.json made buildable: its model type from `architectures` where a trimmed copy
    leaves it out, keys of qeval's own (`_qeval_note`) dropped, positions at least `max_context`.
    `shrink`: the same architecture cut to a CPU-sized test shape (2 layers, hidden 256, 4 heads
    over 2 KV heads, vocabulary 512): the same code path, seconds instead of minutes."""
    import json

    cfg = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    if "model_type" not in cfg:
        arch = (cfg.get("architectures") or [""])[0]
        if arch not in ARCHITECTURES:
            raise ValueError(f"{path}: no model_type, and architecture {arch!r} is not one of {sorted(ARCHITECTURES)}")
        cfg["model_type"] = ARCHITECTURES[arch]
    if shrink:
        cfg |= {
            "num_hidden_layers": 2,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "vocab_size": 512,
        }
        if cfg.get("sliding_window"):
            cfg["sliding_window"] = max_context // 2
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings") or 0), max_context)
    return cfg


def build_model(config: dict[str, Any], setup: Setup, dtype: torch.dtype, device: str) -> tuple[Any, dict[str, Any]]:
    """The architecture of `config` with random weights, created on `device` in `dtype` (no
    checkpoint is read: transformers initialises each tensor where it is allocated), then
    quantized by qeval's weight quantizer for `setup`. Returns the model and what the quantizer did."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval().requires_grad_(False)
    info = hf_quant.quantize_weights(model, setup)
    return model, info


def predictions(shape: ModelShape, setup: Setup, dtype: str, context: int) -> dict[str, int]:
    """qeval's own predictions for the setup: weights, KV per token, one sequence of `context` on
    the transformers backend's accounting."""
    seq = predict_sequence(shape, setup, dtype, context, HeldKv())
    return {
        "weights_bytes": predict_weights_bytes(shape, setup, dtype),
        "kv_bytes_per_token": predict_kv_bytes_per_token(shape, setup, dtype),
        "kv_bytes_per_sequence": seq.total,
    }


def formula(weights: int, sequence: int, capacity: int, context: int) -> dict[str, Any]:
    """The one capacity formula on this device: qeval's default budget, and the raw one (nothing
    held back: the theoretical concurrency the seed's fragmentation share is counted against)."""
    gib = capacity / GIB
    out = {}
    for name, knobs in (("default_budget", DEFAULT_BUDGET), ("raw", RAW_BUDGET)):
        budget = Budget(gpu_memory_gib=gib, context_len=context, **knobs)
        cap = kv_capacity(weights, sequence, budget)
        out[name] = {
            "max_concurrency": cap.max_concurrency,
            "kv_cache_tokens": cap.kv_cache_tokens,
            "budget": budget.describe(),
        }
    return out


def _shape_of(model: Any) -> tuple[int, int, int]:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers, c.num_key_value_heads, head_dim


@torch.no_grad()
def one_sequence(model: Any, setup: Setup, context: int, meter: Meter, device: str) -> dict[str, Any]:
    """A real prefill of context - 1 random tokens and one decode step into the setup's cache."""
    meter.clean()
    meter.reset_peak()
    base = meter.allocated()
    ids = torch.randint(0, model.config.vocab_size, (1, context - 1), device=device)
    cache = kv_cache.new_cache(model.config, setup)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True, logits_to_keep=1)
    meter.sync()
    storage = cache_storage_bytes(cache)
    held = cache_bytes(cache)
    peak = meter.peak()
    del cache, out
    return {
        "kv_bytes_per_sequence": storage,
        "kv_bytes_per_token": held // context,
        "prefill_activations_bytes": max(peak - base - storage, 0),
    }


@torch.no_grad()
def fill_and_step(model: Any, setup: Setup, batch: int, context: int, meter: Meter, device: str) -> dict[str, Any]:
    """`batch` sequences' caches at context - 1 tokens (random K/V through each layer's own update),
    then one batched decode step over all of them. Raises what the allocator raises."""
    layers, kv_heads, head_dim = _shape_of(model)
    dtype = model.get_input_embeddings().weight.dtype  # the compute dtype: quantized layers keep it too
    meter.reset_peak()
    start = meter.allocated()
    cache = kv_cache.new_cache(model.config, setup)
    k = torch.randn(batch, kv_heads, context - 1, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    for i in range(layers):
        cache.update(k, v, i)
    del k, v
    meter.sync()
    pool = cache_storage_bytes(cache)
    fill_peak = meter.peak()
    meter.reset_peak()
    before = meter.allocated()
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device)
    mask = torch.ones(batch, context, dtype=torch.long, device=device)
    pos = torch.full((batch, 1), context - 1, dtype=torch.long, device=device)
    model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
    meter.sync()
    peak, reserved_peak = meter.peak(), meter.reserved_peak()
    # after the step, as the prediction counts it: a sliding layer trims its prefill's slice to its
    # window on the first decode step (until then it pins all L tokens: kv_pool_after_fill_bytes)
    out = {
        "batch": batch,
        "start_allocated": start,
        "kv_pool_bytes": cache_storage_bytes(cache),
        "kv_pool_after_fill_bytes": pool,
        "fill_peak_bytes": fill_peak,
        "allocated_before_step": before,
        "step_peak_bytes": peak,
        "step_activations_bytes": max(peak - before, 0),
        "reserved_peak_bytes": reserved_peak,
        "allocator_slack_bytes": None if reserved_peak is None else reserved_peak - peak,
        "nvml_used_bytes": meter.nvml_used(),
        "runtime_overhead_bytes": meter.runtime_overhead(),
    }
    del cache
    return out


def try_batch(
    model: Any, setup: Setup, batch: int, context: int, meter: Meter, device: str, resident: int
) -> dict[str, Any] | None:
    """fill_and_step's figures, or None when it ran out of memory (everything it held is freed)."""
    meter.clean()
    failed = False
    try:
        trial = fill_and_step(model, setup, batch, context, meter, device)
        meter.admit(resident, trial)
        return trial
    except Exception as exc:  # an allocation failure is the answer; anything else is raised
        if not is_oom(exc):
            raise
        failed = True
    if failed:  # outside the handler: the traceback, and the tensors its frames held, are gone
        meter.clean()
    return None


def _fits(
    model: Any, setup: Setup, context: int, meter: Meter, device: str, resident: int, batch: int
) -> dict[str, Any] | None:
    return try_batch(model, setup, batch, context, meter, device, resident)


def search(
    fits: Callable[[int], dict[str, Any] | None],
    start: int,
    cap: int,
    deadline: float,
    soft_deadline: float | None = None,
    min_trials: int = 3,
    max_trials: int = 12,
) -> dict[str, Any]:
    """The largest batch `fits` accepts, up to `cap`: from `start`, up by 25% while it fits, then
    bisected between the largest that fit and the smallest that failed, to 1% (or 1 sequence), as
    many trials as `max_trials` allows before `deadline` (time.monotonic; no trial starts that would
    likely end past it), and past `soft_deadline` (this search's share of the time) only while fewer
    than `min_trials` ran. `fits` is monotone: memory only grows with the batch."""
    lo, hi = 0, None
    best: dict[str, Any] | None = None
    trials: list[dict[str, Any]] = []
    b = max(1, min(start, cap))
    last_s = 0.0
    soft = deadline if soft_deadline is None else min(soft_deadline, deadline)

    def time_left() -> bool:
        end = time.monotonic() + 2 * last_s
        return end < deadline and (len(trials) < min_trials or end < soft)

    while len(trials) < max_trials and time_left():
        t0 = time.monotonic()
        r = fits(b)
        last_s = time.monotonic() - t0
        trials.append({"batch": b, "fit": r is not None, "seconds": round(last_s, 2)})
        if r is not None:
            lo, best = b, r
        else:
            hi = b
        if hi is None:
            if b >= cap:
                break
            b = min(cap, max(b + 1, math.floor(b * 1.25)))
            continue
        if hi - lo <= max(1, math.ceil(lo * 0.01)) or hi == 1:
            break
        b = (lo + hi) // 2
    done = hi is not None and (hi - lo <= max(1, math.ceil(lo * 0.01)) or hi == 1)
    return {
        "fit": lo,
        "failed_at": hi,
        "capped": hi is None and lo >= cap,
        "converged": done or lo >= cap,
        "trials": trials,
        "at_fit": best,
    }


def measure_setup(
    model: Any,
    setup: Setup,
    shape: ModelShape,
    dtype: str,
    contexts: list[int],
    meter: Meter,
    device: str,
    weights: dict[str, Any],
    max_batch: int,
    deadline: float,
    cell_seconds: float,
) -> list[dict[str, Any]]:
    """Every context of one loaded setup: predictions, one real sequence, the concurrency search.
    A cell whose time would pass `deadline` is recorded as skipped."""
    cells = []
    for context in sorted(contexts, reverse=True):  # the longest first: the seed's example, if time runs short
        cell: dict[str, Any] = {
            "setup": setup.name,
            "weights": setup.weights or dtype,
            "kv_cache": setup.kv_cache,
            "context": context,
            "predicted": predictions(shape, setup, dtype, context),
            "weights_measured": weights,
        }
        left = deadline - time.monotonic()
        if left < 0.25 * cell_seconds:
            cell["skipped"] = f"the time budget left {max(left, 0):.0f} s for this cell"
            cells.append(cell)
            continue
        cell["one_sequence"] = one_sequence(model, setup, context, meter, device)
        seq_pred = cell["predicted"]["kv_bytes_per_sequence"]
        cell["formula"] = formula(weights["measured"], seq_pred, meter.capacity, context)
        # qeval's default budget usually fits (it holds back 10% and a GiB); on a small device it is 0
        guess = cell["formula"]["default_budget"]["max_concurrency"] or cell["formula"]["raw"]["max_concurrency"]
        start = max(1, math.floor(guess))
        fits = functools.partial(_fits, model, setup, context, meter, device, weights["measured"])
        cell["search"] = search(fits, start, max_batch, deadline, time.monotonic() + cell_seconds)
        cells.append(cell)
    return cells
