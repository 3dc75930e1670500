"""Turn a task's documents into batched backend requests, and responses into per-sample
records and task metrics (lm-evaluation-harness metric definitions)."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field, replace

import numpy as np

from qeval.backends.base import (
    Backend,
    GenerateRequest,
    LoglikelihoodRequest,
    Progress,
    RollingRequest,
    generated_tokens,
)
from qeval.config.chat import strip_thinking
from qeval.records.spool import RecordSpool, TopkSpool
from qeval.results.samples import SampledRepeat, SampleRecord
from qeval.tasks import Task
from qeval.tasks.divergence import (
    TokenDivergence,
    continuation_divergence,
    document_divergence,
    pack_topk,
    request_references,
    split_reference,
)
from qeval.tasks.long_context.buckets import bucket_sums
from qeval.tasks.sampling import repeat_sampling


@dataclass
class TaskResult:
    """One (setup, task): per-sample records, metrics, and (perplexity) top-k distributions.
    A task scored in chunks holds its records and top-k in spools on disk (qeval/records/spool.py)."""

    records: list[SampleRecord] | RecordSpool
    metrics: dict[str, dict[str, float | None]]
    topk: dict[str, np.ndarray] | TopkSpool = field(default_factory=dict)
    #: the task's token-level distribution of KL to the baseline and Δp (kl_distribution), where
    #: the setup was scored against the baseline's top-k; stored in the task's meta
    kl_distribution: dict[str, float] | None = None


def n_requests(task: Task) -> int:
    if task.spec.output_type == "multiple_choice":
        return sum(len(task.choices(d)) for d in task.docs)
    if task.spec.output_type == "generate_until":
        return len(task.docs) * getattr(task.spec, "repeats", 1)
    return len(task.docs)


def score_task(
    backend: Backend,
    task: Task,
    progress: Progress,
    reference: dict[str, np.ndarray] | None = None,
    tokens: TokenDivergence | None = None,
) -> TaskResult:
    """Score every document of `task`; `reference` is the baseline's top-k (the KL reference of
    perplexity and multiple-choice tasks). `tokens`: where a task scored a chunk at a time
    (qeval/tasks/sequential.py) collects a multiple-choice task's token divergence, summed up by
    its owner once."""
    output_type = task.spec.output_type
    if output_type == "multiple_choice":
        result = _multiple_choice(backend, task, progress, reference, tokens)
    elif output_type == "generate_until":
        result = _generate(backend, task, progress)
    else:
        result = _rolling(backend, task, progress, reference)
    # the task's metric_list selects what it reports; the comparison signals stay
    keep = set(task.metrics) | {"kl_to_baseline", "top1_agreement"}
    result.metrics = {k: v for k, v in result.metrics.items() if k in keep}
    return result


def _multiple_choice(
    backend: Backend,
    task: Task,
    progress: Progress,
    reference: dict[str, np.ndarray] | None = None,
    tokens: TokenDivergence | None = None,
) -> TaskResult:
    delim = task.choice_delimiter
    reqs: list[LoglikelihoodRequest] = []
    spans: list[tuple[int, int]] = []
    prompts = [task.prompt(doc) for doc in task.docs]
    for doc, prompt in zip(task.docs, prompts, strict=True):
        choices = task.choices(doc)
        spans.append((len(reqs), len(choices)))
        reqs += [LoglikelihoodRequest(prompt, delim + c) for c in choices]
    refs = request_references(reference, len(reqs))
    if refs is not None:
        reqs = [replace(r, ref_indices=ref[0]) for r, ref in zip(reqs, refs, strict=True)]
    results = backend.loglikelihood(reqs, progress)
    records: list[SampleRecord] = []
    for i, (doc, (start, n)) in enumerate(zip(task.docs, spans, strict=True)):
        choices, gold = task.choices(doc), int(task.target(doc))
        lls = [r.logprob for r in results[start : start + n]]
        pred = int(np.argmax(lls))
        pred_norm = int(np.argmax([ll / len(c) for ll, c in zip(lls, choices, strict=True)]))  # lm-eval: chars
        records.append(
            SampleRecord(
                sample_id=task.doc_id(i),
                prompt=prompts[i],
                target=choices[gold],
                prediction=choices[pred],
                correct=pred == gold,
                correct_norm=pred_norm == gold,
                loglikelihoods=lls,
                nll=-lls[gold],
                n_tokens=results[start + gold].n_tokens,
            )
        )
    topk, divergence = continuation_divergence([results[a : a + n] for a, n in spans], refs, records, tokens)
    return TaskResult(records, record_metrics("multiple_choice", records), topk, divergence)


def _extract(text: str, pattern: str | None) -> str:
    if pattern:
        m = re.search(pattern, text)
        return (m.group(1) if m and m.groups() else m.group(0) if m else "").strip()
    return text.strip()


def _generate(backend: Backend, task: Task, progress: Progress) -> TaskResult:
    """Greedy, or sampled `repeats` times a document with one seed per repeat (qeval/tasks/sampling.py):
    one record per document, its `correct` the mean over its repeats, each repeat kept."""
    g = task.spec.generation_kwargs
    prompts = [task.prompt(d) for d in task.docs]
    plans = repeat_sampling(task.spec, getattr(task, "model_card", {}))
    reqs = [GenerateRequest(p, tuple(g.until), g.max_gen_toks, s) for s in plans for p in prompts]
    outputs = backend.generate(reqs, progress)
    n = len(task.docs)
    records: list[SampleRecord] = []
    for i, doc in enumerate(task.docs):
        target = str(task.target(doc)).strip()
        outs = [outputs[r * n + i] for r in range(len(plans))]
        responses = [strip_thinking(out, task.think_end_token) for out in outs]  # the reasoning block is not the answer
        preds = [_extract(r, task.spec.answer_regex) for r in responses]
        hits = [p == target for p in preds]
        voted = _majority(preds)
        lengths = [generated_tokens(out) for out in outs]
        record = SampleRecord(
            sample_id=task.doc_id(i),
            prompt=prompts[i],
            target=target,
            prediction=preds[0] if len(plans) == 1 else voted,
            raw_output=str(outs[0]),
            correct=hits[0] if len(plans) == 1 else float(np.mean(hits)),
            loglikelihoods=None,
            nll=None,
            n_tokens=None,
            # sampled: the mean over repeats, rounded (the report averages it over documents)
            generated_tokens=None if None in lengths else round(float(np.mean(lengths))),  # type: ignore[arg-type]
        )
        if responses[0] != outs[0]:  # a reasoning block stripped: what was scored
            record.response = responses[0]
        if plans[0] is not None:  # sampled: every repeat, its seed, and pass@k / maj@k over them
            record.repeats = [
                SampledRepeat(seed=s.seed, raw_output=str(o), prediction=p, correct=h)
                for s, o, p, h in zip(plans, outs, preds, hits, strict=True)
                if s is not None
            ]
            record.pass_at_k = any(hits)
            record.maj_at_k = voted == target
        records.append(record)
    return TaskResult(records, record_metrics("generate_until", records, sampled=plans[0] is not None))


def record_metrics(
    output_type: str, records: list[SampleRecord], sampled: bool = False
) -> dict[str, dict[str, float | None]]:
    """A multiple-choice or generation task's metrics over its records (a task scored whole, or the
    documents a sequential cell scored: qeval/tasks/sequential.py). Multiple choice: acc and
    acc_norm; generation: exact_match (a sampled document's mean over its repeats) and, sampled,
    pass@k and maj@k."""
    if output_type == "multiple_choice":
        return {
            "acc": mean_se([bool(r.correct) for r in records]),
            "acc_norm": mean_se([bool(r.correct_norm) for r in records]),
        }
    metrics = {"exact_match": mean_se([float(r.correct or 0.0) for r in records])}
    if sampled:
        # the mean over repeats' standard error is over documents (clustered): k draws of one
        # document are not k independent samples (docs/statistics.md)
        metrics |= {
            "pass_at_k": mean_se([bool(r.pass_at_k) for r in records]),
            "maj_at_k": mean_se([bool(r.maj_at_k) for r in records]),
        }
    return metrics


def _majority(preds: list[str]) -> str:
    """The most frequent answer; a tie goes to the one drawn first (stable across runs)."""
    counts: dict[str, int] = {}
    for p in preds:
        counts[p] = counts.get(p, 0) + 1
    return max(counts, key=lambda p: (counts[p], -preds.index(p)))


def _rolling(backend: Backend, task: Task, progress: Progress, reference: dict[str, np.ndarray] | None) -> TaskResult:
    refs = split_reference(reference, len(task.docs))
    tokens = TokenDivergence()
    reqs = [RollingRequest(task.text(d), None if refs is None else refs[i][0]) for i, d in enumerate(task.docs)]
    results = backend.loglikelihood_rolling(reqs, progress)
    records = []
    for i, (doc, res) in enumerate(zip(task.docs, results, strict=True)):
        rec = SampleRecord(
            sample_id=task.doc_id(i),
            prompt=task.text(doc),
            target=None,
            prediction=None,
            correct=None,
            loglikelihoods=None,
            nll=-res.logprob,
            n_tokens=res.n_tokens,
            n_bytes=len(task.text(doc).encode()),
        )
        kl = top1 = None
        if refs is not None and res.ref_logprobs is not None:
            kl, top1 = document_divergence(rec, refs[i], res, tokens)
        if getattr(task, "buckets", None):  # long-context position_ppl: loss and KL by token position
            rec.buckets = bucket_sums(task.buckets, res.token_logprobs, kl, top1)  # type: ignore[attr-defined]
        records.append(rec)
    return TaskResult(records, _perplexity_metrics(records), pack_topk(results), tokens.summary())


def _perplexity_metrics(records: list[SampleRecord]) -> dict[str, dict[str, float | None]]:
    nll = np.array([r.nll for r in records])
    tok = np.array([r.n_tokens for r in records], dtype=float)
    byt = np.array([r.n_bytes for r in records], dtype=float)
    mean = float(nll.sum() / tok.sum())
    # past ~709 nats a token (finite log-probs of a broken model or server) math.exp raises: the
    # perplexity is infinite, a non-finite score the worker names (qeval/analysis/finite.py)
    ppl = math.inf if mean > math.log(sys.float_info.max) else math.exp(mean)  # NaN stays NaN
    log_se = _ratio_se(nll, tok)["stderr"]
    metrics = {
        "bits_per_byte": _ratio_se(nll / math.log(2), byt),
        "token_perplexity": {"value": ppl, "stderr": None if log_se is None else ppl * log_se},
    }
    if records and records[0].kl is not None:
        w = np.array([r.kl_tokens for r in records], dtype=float)
        metrics["kl_to_baseline"] = _ratio_se(np.array([r.kl for r in records]) * w, w)
        metrics["top1_agreement"] = _ratio_se(np.array([r.top1_agreement for r in records]) * w, w)
    return metrics


def mean_se(values: list[bool] | list[float]) -> dict[str, float | None]:
    """Mean and its standard error (sample std / sqrt(n), as lm-evaluation-harness); None
    where one document leaves it undefined."""
    x = np.asarray(values, dtype=float)
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None
    return {"value": float(x.mean()), "stderr": se}


def _ratio_se(num: np.ndarray, den: np.ndarray) -> dict[str, float | None]:
    """sum(num)/sum(den) and its delta-method standard error over documents."""
    r = float(num.sum() / den.sum())
    n = len(num)
    se = float(np.std(num - r * den, ddof=1) / math.sqrt(n) / den.mean()) if n > 1 else None
    return {"value": r, "stderr": se}
