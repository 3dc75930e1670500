"""The divergence of a setup from the baseline, shared by every kind that scores against the
baseline's top-k: KL(baseline || setup) on the baseline's top-k ids and Δp per token, the
token-level distribution a task sums them into (TokenDivergence), a record's KL and top-1
agreement, and the baseline's top-k packed, joined and split by request (the reference)."""

from __future__ import annotations

import numpy as np

from qeval.backends.base import LoglikelihoodResult, RollingResult
from qeval.results.samples import SampleRecord


def set_divergence(rec: SampleRecord, kl: np.ndarray, top1: np.ndarray) -> None:
    """A record's KL to the baseline and top-1 agreement: means over its scored tokens, and their count."""
    rec.kl, rec.top1_agreement, rec.kl_tokens = float(kl.mean()), float(top1.mean()), int(kl.size)


def kl_top1(ref: Reference, res: RollingResult) -> tuple[np.ndarray, np.ndarray]:
    """KL(baseline || setup) per position on the baseline's top-k ids plus one tail bucket:
    the exact KL of that coarsened distribution, a lower bound of the full KL (the log-sum
    inequality: merging outcomes never raises a KL).

    An engine that returns only its own top-k (vLLM's prompt_logprobs, an OpenAI-compatible
    server's logprobs) leaves the setup's log-prob of a baseline id outside that top-k unknown:
    `ref_logprobs` holds NaN there (qeval/backends/vllm/backend.py `at_ids`), and such ids join
    the tail bucket on both sides, so the figure is still the exact KL of a coarsening, a lower
    bound, only a looser one (never a guessed probability). Top-1 agreement compares the two
    top-1 ids, exact on every backend."""
    ref_idx, ref_logp = ref[0], ref[1]
    n = min(len(ref_idx), len(res.ref_logprobs))  # type: ignore[arg-type]
    p = np.exp(ref_logp[:n].astype(np.float64))
    q = np.exp(res.ref_logprobs[:n].astype(np.float64))  # type: ignore[index]
    known = np.isfinite(q)  # NaN: outside the setup engine's returned top-k
    p, q = np.where(known, p, 0.0), np.where(known, q, 0.0)
    p_tail = np.clip(1 - p.sum(1), 1e-12, 1)
    q_tail = np.clip(1 - q.sum(1), 1e-12, 1)
    p, q = np.clip(p, 1e-12, 1), np.clip(q, 1e-12, 1)
    kl = np.where(known, p * (np.log(p) - np.log(q)), 0.0).sum(1) + p_tail * (np.log(p_tail) - np.log(q_tail))
    top1 = res.topk_indices[:n, 0] == ref_idx[:n, 0]
    return np.maximum(kl, 0.0), top1


def delta_p(ref: Reference, res: RollingResult) -> np.ndarray | None:
    """Per position, the setup's probability of the actual next token minus the baseline's
    (llama.cpp's Δp); None for a reference stored before it kept the actual tokens' log-probs."""
    if len(ref) < 3 or ref[2] is None:
        return None
    n = min(len(ref[2]), res.n_tokens)
    return np.exp(res.token_logprobs[:n].astype(np.float64)) - np.exp(ref[2][:n].astype(np.float64))


#: quantiles of the token-level KL and Δp distributions, as `llama-perplexity --kl-divergence` prints them
KL_QUANTILES = {"median": 0.5, "p90": 0.9, "p99": 0.99, "p99_9": 0.999}
DP_QUANTILES = {"p1": 0.01, "p5": 0.05, "p25": 0.25, "median": 0.5, "p75": 0.75, "p95": 0.95, "p99": 0.99}


#: arrays TokenDivergence holds before it joins them into one
COMPACT_EVERY = 1024


class TokenDivergence:
    """Every scored token's KL(baseline || setup), top-1 agreement and Δp over one task, summed
    up as a distribution (KL_QUANTILES, DP_QUANTILES, mean, max, RMS, same top-1 share)."""

    def __init__(self) -> None:
        self.kl: list[np.ndarray] = []
        self.top1: list[np.ndarray] = []
        self.dp: list[np.ndarray] = []
        self.dp_missing = False

    def add(self, kl: np.ndarray, top1: np.ndarray, dp: np.ndarray | None) -> None:
        self.kl.append(kl)
        self.top1.append(top1)
        if dp is None:
            self.dp_missing = True
        else:
            self.dp.append(dp)
        if len(self.kl) >= COMPACT_EVERY:
            self._compact()

    def _compact(self) -> None:
        """Join the arrays held so far into one each: a request's few tokens are a small array
        whose ~100-byte header outweighed its values (1.5 KB a HellaSwag document, measured with
        tracemalloc); joined, what is held is the values alone, 17 bytes a scored token."""
        self.kl = [np.concatenate(self.kl)]
        self.top1 = [np.concatenate(self.top1)]
        if self.dp:
            self.dp = [np.concatenate(self.dp)]

    def arrays(self) -> dict[str, np.ndarray]:
        """What is held so far, joined: `kl`, `top1` and `dp` (where every token had one), for a
        saved state (qeval/tasks/lm_eval/resume.py); `restore` takes them back."""
        if not self.kl:
            return {}
        self._compact()
        out = {"kl": self.kl[0], "top1": self.top1[0]}
        return out | ({"dp": self.dp[0]} if self.dp else {})

    def restore(self, arrays: dict[str, np.ndarray | None], dp_missing: bool) -> None:
        """Hold `arrays()`'s output again (before anything else is added)."""
        kl, top1, dp = arrays.get("kl"), arrays.get("top1"), arrays.get("dp")
        if kl is not None and top1 is not None and kl.size:
            self.kl, self.top1 = [kl], [top1]
            self.dp = [dp] if dp is not None and dp.size else []
        self.dp_missing = dp_missing

    def summary(self) -> dict[str, float] | None:
        if not self.kl:
            return None
        kl = np.concatenate(self.kl)
        if kl.size == 0:
            return None
        out = {
            "tokens": float(kl.size),
            "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()),
            "same_top1": float(np.concatenate(self.top1).mean()),
        }
        out |= {f"kl_{name}": float(np.quantile(kl, q)) for name, q in KL_QUANTILES.items()}
        if self.dp and not self.dp_missing:
            dp = np.concatenate(self.dp)
            out |= {
                "dp_mean": float(dp.mean()),
                "dp_rms": float(np.sqrt((dp**2).mean())),
                "dp_min": float(dp.min()),
                "dp_max": float(dp.max()),
            }
            out |= {f"dp_{name}": float(np.quantile(dp, q)) for name, q in DP_QUANTILES.items()}
        return out


#: one document's reference: the baseline's top-k ids and log-probs per position, and (references
#: stored since Δp) its log-prob of each actual token
Reference = tuple[np.ndarray, ...]


def document_divergence(
    rec: SampleRecord, ref: Reference, res: RollingResult, tokens: TokenDivergence
) -> tuple[np.ndarray, np.ndarray]:
    """A scored text's KL to the baseline and top-1 agreement per token: set on its record and
    added to the task's token-level distribution (with its Δp); returned for per-position use."""
    kl, top1 = kl_top1(ref, res)
    set_divergence(rec, kl, top1)
    tokens.add(kl, top1, delta_p(ref, res))
    return kl, top1


def as_rolling(res: LoglikelihoodResult) -> RollingResult | None:
    """A continuation's scored positions in RollingResult's form, for the KL helpers above; None
    where the backend gave no per-token arrays."""
    if res.token_logprobs is None or res.topk_indices is None or res.topk_logprobs is None:
        return None
    return RollingResult(res.token_logprobs, res.topk_indices, res.topk_logprobs, res.ref_logprobs)


def request_references(ref: dict[str, np.ndarray] | None, n_requests: int) -> list[Reference] | None:
    """The baseline's reference per request of a log-likelihood task, in (document, choice)
    order; None unless it holds exactly that many requests (other data: no KL, never a wrong one)."""
    if ref is None or len(ref["offsets"]) != n_requests + 1:
        return None
    return split_reference(ref, n_requests)


def continuation_divergence(
    results: list[list[LoglikelihoodResult]],
    refs: list[Reference] | None,
    records: list[SampleRecord],
    tokens: TokenDivergence | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float] | None]:
    """Per document (its continuations in choice order): the top-k to keep as a reference, and,
    against the baseline's `refs`, KL and top-1 agreement over the scored tokens of every choice
    added to its record, and the task's token-level distribution. Tokens of a choice whose
    reference does not match are left out. `tokens`: where a task scored in chunks collects
    its tokens (no summary is returned then: its owner sums them up once)."""
    flat = [as_rolling(r) for doc in results for r in doc]
    if not flat or any(r is None for r in flat):
        return {}, None
    rolled: list[RollingResult] = flat  # type: ignore[assignment]
    shared = tokens is not None
    tokens = tokens if tokens is not None else TokenDivergence()
    if refs is not None:
        k = 0
        for rec, doc in zip(records, results, strict=True):
            kls, tops = [], []
            for _ in doc:
                res, ref = rolled[k], refs[k]
                k += 1
                if res.ref_logprobs is None:
                    continue
                kl, top1 = kl_top1(ref, res)
                kls.append(kl)
                tops.append(top1)
                tokens.add(kl, top1, delta_p(ref, res))
            if kls:
                kl_all, top_all = np.concatenate(kls), np.concatenate(tops)
                if kl_all.size:
                    set_divergence(rec, kl_all, top_all)
    # a shared accumulator is summed up once by its owner, not again after every chunk
    return pack_topk(rolled), None if shared else tokens.summary()


def pack_topk(results: list[RollingResult]) -> dict[str, np.ndarray]:
    lengths = np.array([r.n_tokens for r in results], dtype=np.int64)
    return {
        "offsets": np.concatenate([[0], np.cumsum(lengths)]),
        "indices": np.concatenate([r.topk_indices for r in results]).astype(np.int32),
        "logprobs": np.concatenate([r.topk_logprobs for r in results]).astype(np.float32),
        "token_logprobs": np.concatenate([r.token_logprobs for r in results]).astype(np.float32),
    }


def concat_topk(packs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`pack_topk`'s form of consecutive packs joined, as one pack of all their requests."""
    if len(packs) == 1:
        return packs[0]
    offsets, base = [packs[0]["offsets"]], int(packs[0]["offsets"][-1])
    for pack in packs[1:]:
        offsets.append(pack["offsets"][1:] + base)
        base += int(pack["offsets"][-1])
    return {"offsets": np.concatenate(offsets)} | {
        key: np.concatenate([p[key] for p in packs]) for key in packs[0] if key != "offsets"
    }


def split_reference(ref: dict[str, np.ndarray] | None, n_docs: int) -> list[Reference] | None:
    if ref is None or len(ref["offsets"]) < n_docs + 1:
        return None
    o, tok = ref["offsets"], ref.get("token_logprobs")
    return [
        (ref["indices"][o[i] : o[i + 1]], ref["logprobs"][o[i] : o[i + 1]])
        + ((tok[o[i] : o[i + 1]],) if tok is not None else ())
        for i in range(n_docs)
    ]
