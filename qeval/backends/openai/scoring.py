"""Scores through an OpenAI-compatible API, request for request what the in-process vllm backend
asks its engine (qeval/backends/vllm/backend.py), so the two agree document by document.

Prompts are sent as token ids (`/v1/completions` takes a list of ints), tokenised here by
qeval's lm-eval conventions (qeval/backends/tokens.py): the server adds no special tokens to an
id prompt, so what is scored is exactly what the in-process engine scores. Chat templates are
rendered by the task kinds before a request reaches a backend (qeval/tasks/chat.py), as for
every backend, so generation too goes to `/v1/completions` with the rendered prompt's ids.

Log-likelihoods, either way the server offers them:
- `prompt_logprobs` (vLLM's extra parameter): per prompt position a map id -> {logprob, rank}
  with the actual token and the top-k (the actual token once, where it is in the top-k);
- `echo` + `logprobs` (the OpenAI legacy form; vLLM's `return_tokens_as_token_ids` names the
  tokens `token_id:N`): per position the actual token's log-prob and a map of the top-k plus
  the actual token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from qeval.backends.base import TOPK, GenerateRequest, Generation, Sampling

#: a position's entries: (token id, log-prob), any order
Entries = list[tuple[int, float]]


def logprob_body(model: str, prompt: list[int], mode: str) -> dict[str, Any]:
    """The /v1/completions request for the log-probs of every position of `prompt`."""
    if mode == "prompt_logprobs":
        return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": TOPK}
    return {"model": model, "prompt": prompt, "max_tokens": 0, "temperature": 0.0, "echo": True, "logprobs": TOPK,
            "return_tokens_as_token_ids": True}


def positions(answer: dict[str, Any], mode: str, prompt: list[int]) -> list[tuple[float, Entries] | None]:
    """Per prompt position: (the actual token's log-prob, the top-k entries sorted best first);
    None at position 0 (nothing predicts it)."""
    choice = first_choice(answer)
    out: list[tuple[float, Entries] | None] = []
    if mode == "prompt_logprobs":
        rows = choice.get("prompt_logprobs")
        if rows is None or len(rows) != len(prompt):
            raise RuntimeError("the server returned no prompt_logprobs for every prompt token")
        for pos, row in enumerate(rows):
            if row is None:
                out.append(None)
                continue
            if str(prompt[pos]) not in row:
                raise RuntimeError(f"the server's prompt_logprobs at position {pos} leave out the prompt's own token")
            actual = row[str(prompt[pos])]["logprob"]
            ranked = sorted(row.items(), key=lambda kv: (kv[1].get("rank") or 0, -kv[1]["logprob"]))
            top = [(int(k), float(v["logprob"])) for k, v in ranked if (v.get("rank") or 0) <= TOPK][:TOPK]
            out.append((float(actual), top))
        return out
    lp = choice.get("logprobs") or {}
    token_lps, tops = lp.get("token_logprobs"), lp.get("top_logprobs")
    if token_lps is None or tops is None or len(token_lps) < len(prompt):
        raise RuntimeError("the server returned no echoed logprobs for every prompt token")
    for pos in range(len(prompt)):
        if token_lps[pos] is None or tops[pos] is None:
            out.append(None)
            continue
        entries = sorted(((_token_id(k), float(v)) for k, v in tops[pos].items()), key=lambda e: -e[1])
        if len(entries) > TOPK:  # the actual token was added outside the top-k: not one of them
            entries = [e for e in entries if e[0] != prompt[pos]][:TOPK]
        out.append((float(token_lps[pos]), entries))
    return out


def _token_id(key: str) -> int:
    if key.startswith("token_id:"):
        return int(key[len("token_id:"):])
    raise RuntimeError(f"the server named a top token {key[:40]!r}, not `token_id:N`: it ignores "
                       "return_tokens_as_token_ids (use logprobs: prompt_logprobs, or a vLLM server)")


def window_arrays(rows: list[tuple[float, Entries] | None], start: int, n: int) -> tuple[np.ndarray, ...]:
    """(actual-token log-probs [n], top-k ids [n, k], top-k log-probs [n, k]) of the n scored
    positions from `start`, as the vllm backend's window arrays are (float64 log-probs)."""
    tok = np.empty(n, dtype=np.float64)
    ids = np.zeros((n, TOPK), dtype=np.int32)
    lps = np.full((n, TOPK), -np.inf, dtype=np.float64)
    for i in range(n):
        row = rows[start + i]
        if row is None:
            raise RuntimeError(f"no log-probs at prompt position {start + i}")
        tok[i] = row[0]
        top = row[1][:TOPK]
        if len(top) < TOPK:
            raise RuntimeError(f"the server returned {len(top)} top log-probs, not {TOPK} (its max_logprobs "
                               f"must be at least {TOPK + 1}: vllm serve --max-logprobs)")
        ids[i] = [t for t, _ in top]
        lps[i] = [lp for _, lp in top]
    return tok, ids, lps


def score_prompt(post: Callable[[dict[str, Any]], Any], model: str, prompt: list[int], mode: str,
                 start: int, n: int) -> tuple[np.ndarray, ...]:
    """One request: the window arrays of the n positions of `prompt` from `start`."""
    return window_arrays(positions(post(logprob_body(model, prompt, mode)), mode, prompt), start, n)


def generate_body(model: str, prompt: list[int], req: GenerateRequest) -> dict[str, Any]:
    """The /v1/completions request of one generation: greedy, or the request's seeded sampling
    (top_k and seed as vLLM's extra parameters), stopped at its stop strings."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": req.max_gen_toks,
                            "stop": list(req.until) or None}
    s: Sampling | None = req.sampling
    # every sampling field set: vLLM's server fills the ones a request leaves out from the model's
    # generation_config.json (a repetition_penalty of 1.05 changes greedy text), and the in-process
    # engine, given explicit SamplingParams, never reads it
    body |= NEUTRAL_SAMPLING
    if s is None:
        body["temperature"] = 0.0
    else:
        body |= {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k if s.top_k > 0 else -1,
                 "seed": s.seed}
    return body


#: the sampling fields at the values that leave the model's distribution as it is
NEUTRAL_SAMPLING: dict[str, Any] = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                    "presence_penalty": 0.0, "frequency_penalty": 0.0}


def first_choice(answer: Any) -> dict[str, Any]:
    """The first choice of a completion answer; a RuntimeError for an answer without one."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise RuntimeError("the server's answer has no choices")
    return choices[0]


def generation(answer: dict[str, Any]) -> Generation:
    """The text of a completion and the tokens the server says it generated."""
    text = first_choice(answer).get("text") or ""
    usage = answer.get("usage") or {}
    return Generation(text, int(usage.get("completion_tokens") or 0))


def probe_logprobs(client: Any, model: str, mode: str) -> str | None:
    """Ask for the log-probs of a three-token prompt; why they are unusable, or None."""
    from qeval.backends.openai.client import ServerError, Unreachable

    prompt = [1, 2, 3]
    try:
        window_arrays(positions(client.post("/completions", logprob_body(model, prompt, mode)), mode, prompt), 1, 2)
    except (ServerError, Unreachable):
        raise
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as exc:
        return str(exc) or type(exc).__name__
    return None
