"""The backend protocol: batch calls, typed requests and results (lm-evaluation-harness style)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qeval.backends.tokens import Conventions, encode_pair, memoized, rolling_windows, truncate
from qeval.records.job import MemoryFigure  # the backends build it from here; the outcome stores it

if TYPE_CHECKING:
    from qeval.backends.workload import Measurement, Workload
    from qeval.config import RunConfig
    from qeval.config.performance import ServingSpec
    from qeval.config.setups import Setup
    from qeval.workload.trace import Trace

#: a progress callback: called with the number of requests just finished
Progress = Callable[[int], None]
#: next-token ids kept per position of a perplexity text, for KL against the baseline
TOPK = 16


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """Score `continuation` given `context` (the delimiter already joined in); `ref_indices`
    ([n_continuation_tokens, k]) asks for log-probs at the baseline's top-k ids at each scored
    position, for the KL distribution on a multiple-choice task's scored tokens."""

    context: str
    continuation: str
    ref_indices: np.ndarray | None = field(default=None, compare=False, hash=False)

    def reference(self, n_tokens: int) -> np.ndarray | None:
        """`ref_indices` where they cover exactly the continuation's `n_tokens` tokens, else None
        (no KL for this request)."""
        return self.ref_indices if self.ref_indices is not None and len(self.ref_indices) == n_tokens else None


@dataclass
class LoglikelihoodResult:
    """A continuation's summed log-prob, whether greedy decoding gives it, and per scored token
    what a KL reference needs: the actual token's log-prob and this model's top-k (as
    RollingResult has them), and the log-probs at the request's `ref_indices` when it gave them
    (None when it gave none, or when they do not cover exactly the continuation's tokens)."""

    logprob: float
    is_greedy: bool
    n_tokens: int
    token_logprobs: np.ndarray | None = None  # [n_tokens]
    topk_indices: np.ndarray | None = None  # [n_tokens, k]
    topk_logprobs: np.ndarray | None = None  # [n_tokens, k]
    ref_logprobs: np.ndarray | None = None  # [n_tokens, k] at the reference's ids


@dataclass(frozen=True)
class Sampling:
    """Sampled decoding of one request: temperature > 0, nucleus `top_p` (1: off), `top_k`
    (0: off), and the seed of this request's own random stream (vLLM: SamplingParams(seed=);
    transformers: a torch.Generator per row), so the same seed gives the same text on the
    same engine whatever else shares the batch (docs/tasks.md, "Sampled generation")."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass(frozen=True)
class GenerateRequest:
    context: str
    until: tuple[str, ...]
    max_gen_toks: int
    #: None: greedy (lm-eval's default, do_sample false)
    sampling: Sampling | None = None


class Generation(str):
    """A generated text (cut at the first stop string) that also says how many tokens the
    engine generated for it, the stop token and any reasoning block included: what serving
    the answer costs. A plain `str` where a backend does not count (`generated_tokens(...)`)."""

    n_tokens: int

    def __new__(cls, text: str, n_tokens: int) -> Generation:
        out = super().__new__(cls, text)
        out.n_tokens = int(n_tokens)
        return out

    def __reduce__(self) -> tuple[type[Generation], tuple[str, int]]:
        return Generation, (str(self), self.n_tokens)  # copies and pickles keep the count


def generated_tokens(text: str) -> int | None:
    """The tokens a backend generated for `text`, where it counted them."""
    return text.n_tokens if isinstance(text, Generation) else None


@dataclass
class RollingRequest:
    """Score a whole text; `ref_indices` ([n_tokens, k]) asks for log-probs at a reference's
    top-k token ids, for KL divergence against the baseline."""

    text: str
    ref_indices: np.ndarray | None = None


@dataclass
class RollingResult:
    token_logprobs: np.ndarray  # [n_tokens] log-prob of each actual token
    topk_indices: np.ndarray  # [n_tokens, k] this model's own top-k next-token ids
    topk_logprobs: np.ndarray  # [n_tokens, k]
    ref_logprobs: np.ndarray | None = None  # [n_tokens, k] at the reference's ids

    @property
    def logprob(self) -> float:
        return float(self.token_logprobs.sum())

    @property
    def n_tokens(self) -> int:
        return int(self.token_logprobs.shape[0])


# Engine-agnostic: the vllm and openai backends get top-k log-probs from their engine and turn
# them into results the same way.
def rolling_result(parts: list[tuple[np.ndarray, ...]], ref: np.ndarray | None) -> RollingResult:
    """One document's RollingResult from its windows' (token log-probs, top-k ids, top-k log-probs)."""
    logp = np.concatenate([p[0] for p in parts])
    top_i = np.concatenate([p[1] for p in parts])
    top_l = np.concatenate([p[2] for p in parts])
    return RollingResult(
        logp, top_i, top_l.astype(np.float32), at_ids(None if ref is None else ref[: len(logp)], top_i, top_l)
    )


def window_result(
    req: LoglikelihoodRequest, n_tokens: int, tok: np.ndarray, top_i: np.ndarray, top_l: np.ndarray
) -> LoglikelihoodResult:
    """A continuation's LoglikelihoodResult from an engine's arrays over its `n_tokens` tokens (the
    actual token's log-probs, the top-k ids and log-probs): greedy where every actual token is the
    top-1 (a tie counts, as vLLM's rank 1 does)."""
    return LoglikelihoodResult(
        float(tok.sum()),
        bool(np.all(tok >= top_l[:, 0])),
        n_tokens,
        tok.astype(np.float32),
        top_i,
        top_l.astype(np.float32),
        at_ids(req.reference(n_tokens), top_i, top_l),
    )


def encoded_requests(
    conv: Conventions, requests: list[LoglikelihoodRequest], max_length: int
) -> list[tuple[list[int], list[int]]]:
    """Each request's (context, continuation) tokens as lm-eval splits them, cut to max_length."""
    encode = memoized(conv.encode)
    return [truncate(*encode_pair(conv, r.context, r.continuation, encode), max_length) for r in requests]


def document_windows(
    conv: Conventions, requests: list[RollingRequest], max_length: int
) -> list[tuple[int, list[int], list[int]]]:
    """Every (request index, context, predicted tokens) rolling window of the requests' texts."""
    return [
        (r, ctx, pred)
        for r, req in enumerate(requests)
        for ctx, pred in rolling_windows(conv.encode(req.text), conv.prefix_token_id, max_length)
    ]


def window_results(
    requests: list[RollingRequest],
    windows: list[tuple[int, list[int], list[int]]],
    arrays: Sequence[tuple[np.ndarray, ...]],
) -> list[RollingResult]:
    """Each request's RollingResult from its `document_windows`' arrays (`arrays[i]`: window i's
    token log-probs, top-k ids and top-k log-probs), its windows in order."""
    parts: list[list[tuple[np.ndarray, ...]]] = [[] for _ in requests]
    for (r, _, _), a in zip(windows, arrays, strict=True):
        parts[r].append(a)
    return [rolling_result(p, req.ref_indices) for p, req in zip(parts, requests, strict=True)]


def at_ids(ref: np.ndarray | None, top_i: np.ndarray, top_l: np.ndarray) -> np.ndarray | None:
    """Log-probs at the reference's ids ([n, k_ref]) from the engine's own top-k ([n, k]); NaN
    where a reference id is not among them: the engine did not return its log-prob, and
    qeval/tasks/divergence.py `kl_top1` then merges it into the tail bucket on both sides (the KL
    of a coarser partition: still exact for that partition, still a lower bound of the full KL)
    instead of guessing a probability for it."""
    if ref is None:
        return None
    match = ref[:, :, None] == top_i[:, None, :]  # [n, k_ref, k]
    return np.where(match.any(-1), (match * top_l[:, None, :]).sum(-1), np.nan).astype(np.float32)


class Backend(Protocol):
    """What a serving engine must offer qeval. One instance serves one setup in one process:
    the worker calls load(), the batch calls, memory(), quant_info and library_versions(),
    performance() when the config's performance phase is on, then close(), failure or not."""

    name: str

    def load(self) -> None: ...

    @property
    def quant_info(self) -> dict[str, Any]:
        """What was quantized and how (library, scheme, kernels), for the results."""
        ...

    def loglikelihood(self, requests: list[LoglikelihoodRequest], progress: Progress) -> list[LoglikelihoodResult]: ...

    def loglikelihood_rolling(self, requests: list[RollingRequest], progress: Progress) -> list[RollingResult]: ...

    def generate(self, requests: list[GenerateRequest], progress: Progress) -> list[str]: ...

    def memory(self) -> dict[str, MemoryFigure]: ...

    @property
    def concurrency_limit(self) -> int | None:
        """The most requests the engine serves at once (its scheduler's limit); None: no limit."""
        ...

    def performance(self, workload: Workload) -> Measurement:
        """Time `workload` on the loaded model: per level and timed repeat, its waves, and how
        each figure was taken (qeval/perf, docs/performance.md)."""
        ...

    def library_versions(self) -> dict[str, str]: ...

    def close(self) -> None: ...


# -- serving the workload (`qeval goodput`) ----------------------------------------------------


@dataclass(frozen=True)
class LoadLevel:
    """One level of `qeval goodput`'s load: `requests` requests of the dataset at `data` (written by
    `ServingEngine.write_dataset`) at `rate` requests/s, or, with `time_scale`, the dataset's own
    times multiplied by it; the per-request figures written to `out`."""

    tokenizer: str
    data: Path
    requests: int
    rate: float
    seed: int
    targets: dict[str, float]
    out: Path
    time_scale: float | None = None


@dataclass(frozen=True)
class ServerSetting:
    """What one server start of `qeval goodput` runs with besides the setup: the run's dtype,
    max-model-len and prefix caching, and the grid's engine setting (max-num-seqs, and
    max-num-batched-tokens where the grid sets it)."""

    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    prefix_caching: bool


class LoadGenerator(Protocol):
    """The process that puts each level's load on a server, for the whole run."""

    log: Path

    def close(self) -> None: ...


#: one level measured on a started server: the load generator's result (per-request lists, as
#: qeval/perf/slo.py reads them) and the server's own figures sampled meanwhile (KV usage...)
Measure = Callable[[LoadGenerator, LoadLevel], tuple[dict[str, Any], dict[str, Any]]]


class ServingEngine(Protocol):
    """How `qeval goodput` (qeval/perf/serving.py, engine-agnostic: the search, the SLO verdict,
    serving.json) serves a backend's setups on the workload: the engine's server per engine
    setting, its load generator per level, its printed command. A backend's registry entry
    gives it (`BackendEntry.serving`), None where the backend has no server to tune."""

    #: the server as progress lines name it ("vllm serve")
    name: str

    def serves(self, cfg: RunConfig) -> bool:
        """Whether this config's setups can be served (a server qeval starts itself)."""
        ...

    def serve_line(self, cfg: RunConfig, setup: Setup) -> str:
        """The command that serves `setup` on a GPU with the config's model and context (an
        advised setup's line: docs/advisor.md), the run's own measurement settings left out."""
        ...

    def check_setups(self, cfg: RunConfig, device: str) -> None:
        """One line (UserError) for a setup the server refuses on this device."""
        ...

    def version(self, cfg: RunConfig) -> str:
        """The serving engine's version where it runs (part of a row's key)."""
        ...

    def load_generator_label(self, version: str) -> str:
        """What generates the load, as serving.json records it."""
        ...

    def block_size(self, device: str) -> int:
        """The KV block the server allocates in, in tokens (the workload's plan rounds to it)."""
        ...

    def check_arrivals(self, trace: Trace, serving: ServingSpec, max_model_len: int) -> None:
        """One line (UserError) for arrivals the load generator cannot replay, before any server starts."""
        ...

    def write_dataset(
        self, trace: Trace, tok: Any, serving: ServingSpec, max_model_len: int, path: Path
    ) -> float | None:
        """The load's dataset at `path`; the trace's own mean rate where its times are replayed."""
        ...

    def engine_args(self, cfg: RunConfig, setup: Setup, device: str, setting: ServerSetting) -> dict[str, Any]:
        """The setup's engine arguments at one engine setting."""
        ...

    def command(self, args: dict[str, Any]) -> str:
        """The command line that serves with `args` (printed, and kept in serving.json)."""
        ...

    def start_load(self, cfg: RunConfig, log: Path) -> LoadGenerator:
        """The load generator, started before the first server (its start overlaps the engine's)."""
        ...

    def server(self, cfg: RunConfig, args: dict[str, Any], log: Path) -> AbstractContextManager[Measure]:
        """A server with `args`, healthy, its log at `log`; stopped on leaving."""
        ...
