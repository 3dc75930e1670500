"""lm-eval tasks scored by a qeval backend: an `lm_eval.api.model.LM` over the backend, one
`lm_eval.evaluator.evaluate` call for all of a setup's pending tasks (so each request type is
one batched backend call), and lm-eval's logged samples turned into qeval's per-document
records (lm-eval's doc id, its metric values, log-likelihoods, generation).

Chat templates go through lm-eval's own arguments (`apply_chat_template`, `system_instruction`,
`fewshot_as_multiturn`) and `LM.apply_chat_template`, so lm-eval builds the prompts exactly as
`simple_evaluate(..., apply_chat_template=True)` does with `HFLM`: one `evaluate()` call per set
of chat settings among the leaves."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

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
from qeval.tasks.chat import Chat
from qeval.tasks.lm_eval.session import LmEvalSession
from qeval.tasks.scoring import (
    TaskResult,
    TokenDivergence,
    continuation_divergence,
    delta_p,
    kl_top1,
    pack_topk,
    request_references,
    split_reference,
)


def make_lm(backend: Backend, references: dict[str, dict[str, np.ndarray]], progress: Progress,
            think: dict[str, str | None] | None = None) -> Any:
    """The LM lm-eval calls; built lazily so that importing this module needs no lm-eval.
    `think`: task -> its think_end_token (the reasoning block is stripped before lm-eval's
    filters and metrics see the text, as HFLM's `think_end_token` does)."""
    from lm_eval.api.model import LM

    class QevalLM(LM):
        """lm-eval calls each method once with every request of every task of the call."""

        def __init__(self) -> None:
            super().__init__()
            #: the chat settings of the evaluate() call in progress (lm-eval asks the LM to render)
            self.chat: Chat | None = None
            #: the backend's own result per request, keyed (task, doc_id, idx): token counts and
            #: the perplexity top-k that lm-eval's return types drop
            self.raw: dict[tuple[str, int, int], Any] = {}

        @property
        def tokenizer_name(self) -> str:
            """Only lm-eval's request cache reads it (qeval runs without that cache)."""
            return "qeval"

        def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
            """HFLM.apply_chat_template over the model's tokenizer (qeval/tasks/chat.py)."""
            assert self.chat is not None and self.chat.template is not None
            return self.chat.apply(chat_history, add_generation_prompt)

        def _keep(self, requests: list[Any], results: list[Any]) -> None:
            for r, res in zip(requests, results, strict=True):
                self.raw[(r.task_name, r.doc_id, r.idx)] = res

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            ref_ids = _reference_ids(requests, references)
            res = backend.loglikelihood([LoglikelihoodRequest(r.args[0], r.args[1],
                                                              ref_ids.get((r.task_name, r.doc_id, r.idx)))
                                         for r in requests], progress)
            self._keep(requests, res)
            return [(float(r.logprob), bool(r.is_greedy)) for r in res]

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            n_docs: dict[str, int] = {}
            for r in requests:
                n_docs[r.task_name] = max(n_docs.get(r.task_name, 0), r.doc_id + 1)
            refs = {t: split_reference(references[t], n) for t, n in n_docs.items() if t in references}
            reqs = []
            for r in requests:
                per_doc = refs.get(r.task_name)
                reqs.append(RollingRequest(r.args[0], None if per_doc is None else per_doc[r.doc_id][0]))
            res = backend.loglikelihood_rolling(reqs, progress)
            self._keep(requests, res)
            return [float(r.logprob) for r in res]

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            reqs = []
            for r in requests:
                context, kwargs = r.args[0], dict(r.args[1])
                if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0) > 0:
                    raise ValueError(f"lm-eval task {r.task_name} asks for sampling; qeval's backends generate "
                                     "greedily")
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                reqs.append(GenerateRequest(context, tuple(until), int(kwargs.get("max_gen_toks", 256))))
            out = backend.generate(reqs, progress)
            self._keep(requests, out)  # the whole generation, the reasoning block included
            cut = think or {}  # lm-eval is handed plain strings: what it scores, the block stripped
            return [str(strip_thinking(text, cut.get(r.task_name))) for r, text in zip(requests, out, strict=True)]

    return QevalLM()


def _reference_ids(requests: list[Any], references: dict[str, dict[str, np.ndarray]]) -> dict[tuple[str, int, int],
                                                                                                np.ndarray]:
    """Per (task, doc id, choice) the baseline's top-k ids at its scored tokens, for the tasks
    whose reference holds exactly their requests (stored in that order by `_task_result`)."""
    out: dict[tuple[str, int, int], np.ndarray] = {}
    for task, ref in references.items():
        keys = sorted((r.doc_id, r.idx) for r in requests if r.task_name == task)
        refs = request_references(ref, len(keys))
        if refs is not None:
            out |= {(task, d, i): r[0] for (d, i), r in zip(keys, refs, strict=True)}
    return out


def n_requests(session: LmEvalSession, leaves: list[str]) -> int:
    """Requests the leaves send (multiple choice: one per choice), for the progress bar."""
    total = 0
    for leaf in leaves:
        task, info = session.tasks[leaf], session.infos[leaf]
        docs = list(task.eval_docs)[: info.n_docs]
        total += sum(len(task.doc_to_choice(d)) for d in docs) if info.output_type == "multiple_choice" else len(docs)
    return total


def score_lm_eval(backend: Backend, session: LmEvalSession, leaves: list[str], progress: Progress,
                  references: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, TaskResult]:
    """Score `leaves` in one lm-eval evaluate() call; per leaf, qeval's records and metrics."""
    from lm_eval.evaluator import evaluate

    lm = make_lm(backend, references or {}, progress, {leaf: session.infos[leaf].think_end_token for leaf in leaves})
    by_chat: dict[str | None, list[str]] = defaultdict(list)  # one evaluate() per chat settings
    for leaf in leaves:
        chat = session.chats.get(leaf)
        by_chat[chat.sha256 if chat is not None else None].append(leaf)
    results: dict[str, TaskResult] = {}
    for group in by_chat.values():
        chat = session.chats.get(group[0])
        lm.chat = chat
        tasks = {leaf: session.tasks[leaf] for leaf in group}
        for task in tasks.values():
            task.set_fewshot_seed(session.spec.fewshot_seed)  # re-seed: the sampler is consumed document by document
        samples = {leaf: list(range(session.infos[leaf].n_docs)) for leaf in group}
        templated = chat is not None and chat.template is not None
        out = evaluate(lm=lm, task_dict={"tasks": tasks, "groups": {}, "group_map": {}}, samples=samples,
                       log_samples=True, bootstrap_iters=0, verbosity="ERROR", apply_chat_template=templated,
                       fewshot_as_multiturn=chat is not None and templated and chat.fewshot_as_multiturn,
                       system_instruction=chat.system_prompt if chat is not None else None)
        results |= {leaf: _task_result(leaf, session, out, lm.raw, references or {}) for leaf in group}
    return {leaf: results[leaf] for leaf in leaves}


def _task_result(leaf: str, session: LmEvalSession, out: dict[str, Any], raw: dict[tuple[str, int, int], Any],
                 references: dict[str, dict[str, np.ndarray]]) -> TaskResult:
    info = session.infos[leaf]
    by_doc: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in out["samples"][leaf]:
        by_doc[int(s["doc_id"])].append(s)
    records = [_record(leaf, info.output_type, info.compared_metric, doc_id, entries, raw)
               for doc_id, entries in sorted(by_doc.items())]
    metrics: dict[str, dict[str, float | None]] = {}
    for key, value in out["results"][leaf].items():
        if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
            continue
        name, filt = key.split(",", 1)
        qname = name if filt == "none" else key
        stderr = out["results"][leaf].get(f"{name}_stderr,{filt}")
        if not isinstance(stderr, (int, float)):  # bootstrap_iters=0: lm-eval leaves it out; a mean's is closed form
            stderr = _mean_stderr([r["metrics"].get(qname) for r in records])
        metrics[qname] = {"value": float(value), "stderr": float(stderr) if stderr is not None else None}
    topk: dict[str, np.ndarray] = {}
    if info.output_type == "loglikelihood_rolling":
        results = [raw[(leaf, r["doc_id"], 0)] for r in records]
        topk = pack_topk(results)
        ref = references.get(leaf)
        per_doc = split_reference(ref, len(records)) if ref is not None else None
        tokens = TokenDivergence()
        if per_doc is not None:
            for rec, res, doc_ref in zip(records, results, per_doc, strict=True):
                if res.ref_logprobs is not None:
                    kl, top1 = kl_top1(doc_ref, res)
                    rec |= {"kl": float(kl.mean()), "top1_agreement": float(top1.mean()), "kl_tokens": int(kl.size)}
                    tokens.add(kl, top1, delta_p(doc_ref, res))
        return TaskResult(records, metrics, topk, tokens.summary())
    if info.output_type in ("multiple_choice", "loglikelihood"):  # KL on the scored tokens of every choice
        choices = [[raw[(leaf, r["doc_id"], i)] for i in range(len(r["loglikelihoods"] or [None]))] for r in records]
        refs = request_references(references.get(leaf), sum(len(d) for d in choices))
        topk, divergence = continuation_divergence(choices, refs, records)
        return TaskResult(records, metrics, topk, divergence)
    return TaskResult(records, metrics, topk)


def _record(leaf: str, output_type: str, compared: str, doc_id: int, entries: list[dict[str, Any]],
            raw: dict[tuple[str, int, int], Any]) -> dict[str, Any]:
    """One document's record: lm-eval's doc id and per-document metric values (every filter),
    plus what qeval's comparison and drill-down read (correct, prediction, nll...)."""
    first = entries[0]
    scores: dict[str, Any] = {}
    filtered: dict[str, Any] = {}
    for e in entries:
        filt = e.get("filter", "none")
        for m in e.get("metrics", []):
            scores[m if filt == "none" else f"{m},{filt}"] = e.get(m)
        filtered[filt] = e["filtered_resps"]
    rec: dict[str, Any] = {"sample_id": str(doc_id), "doc_id": doc_id, "prompt": first["arguments"][0][0],
                           "target": _plain(first["target"]), "doc_hash": first.get("doc_hash"),
                           "prompt_hash": first.get("prompt_hash"), "metrics": _scalars(scores),
                           "loglikelihoods": None, "nll": None, "n_tokens": None}
    value = scores.get(compared)
    if output_type == "multiple_choice":
        lls = [float(resp[0][0]) for resp in first["resps"]]
        pred = int(np.argmax(lls))
        rec |= {"loglikelihoods": lls, "prediction": first["arguments"][pred][1].strip(),
                "n_tokens": [raw[(leaf, doc_id, i)].n_tokens for i in range(len(lls))]}
    elif output_type == "generate_until":
        filt = compared.split(",", 1)[1] if "," in compared else "none"
        answer = filtered.get(filt, first["filtered_resps"])
        whole = raw.get((leaf, doc_id, 0), first["resps"][0][0])
        rec |= {"prediction": _plain(answer[0] if isinstance(answer, list) and answer else answer),
                "raw_output": str(whole), "generated_tokens": generated_tokens(whole),
                "filtered": {k: _plain(v) for k, v in filtered.items()}}
        if first["resps"][0][0] != whole:  # a reasoning block stripped: what lm-eval scored
            rec["response"] = first["resps"][0][0]
    elif output_type == "loglikelihood_rolling":
        ll = float(first["resps"][0][0])
        bytes_ = scores.get("bits_per_byte") or scores.get("byte_perplexity")
        words = scores.get("word_perplexity")
        rec |= {"prediction": None, "nll": -ll, "n_tokens": raw[(leaf, doc_id, 0)].n_tokens,
                "n_bytes": int(bytes_[1]) if isinstance(bytes_, (list, tuple)) else None,
                "n_words": int(words[1]) if isinstance(words, (list, tuple)) else None}
    else:  # loglikelihood: one continuation (lambada-style)
        ll, greedy = first["resps"][0][0]
        rec |= {"prediction": None, "nll": -float(ll), "is_greedy": bool(greedy)}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1, 0.0, 1.0):
        rec["correct"] = bool(value)
    else:
        rec["correct"] = None
    return rec


def _mean_stderr(values: list[float | None]) -> float | None:
    """Standard error of a per-document mean (sample std / sqrt(n), as lm-eval's mean_stderr);
    None for metrics that are not per-document means (perplexities)."""
    xs = [v for v in values if v is not None]
    if len(xs) < 2 or len(xs) != len(values):
        return None
    return float(np.std(xs, ddof=1) / math.sqrt(len(xs)))


def _scalars(scores: dict[str, Any]) -> dict[str, float]:
    """Per-document metric values that are numbers (perplexity ones are (ll, count) pairs)."""
    out = {}
    for k, v in scores.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def _plain(value: Any) -> Any:
    """JSON-able: tuples and numpy values made plain."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
