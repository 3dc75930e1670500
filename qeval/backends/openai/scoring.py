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

Answers that cannot be true are refused (BadAnswer, failing the setup): a log-prob that is not a
finite number at most 0, a position whose probabilities sum past 1, a token count below 0 or
above what was asked for, a text longer than its tokens can spell. Each request bounds the
bytes its answer may take (`answer_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from qeval.backends.base import TOPK, GenerateRequest, Generation, Sampling
from qeval.backends.openai.client import BadAnswer

#: a log-prob above 0 by more than float32 rounding of log_softmax is a probability above 1
LOGPROB_SLACK = 1e-3
#: the bytes an answer may take: this much, plus per prompt position of a log-prob request
#: (TOPK + 1 entries of an id, log-prob, rank and decoded token: vLLM's take about 70 bytes each),
#: plus per generated token (its text, JSON-escaped, and its share of the answer's fields)
BASE_ANSWER_BYTES = 2**20
BYTES_PER_ENTRY = 512
BYTES_PER_GENERATED_TOKEN = 4096

#: a position's entries: (token id, log-prob), any order
Entries = list[tuple[int, float]]


def logprob_body(model: str, prompt: list[int], mode: str) -> dict[str, Any]:
    """The /v1/completions request for the log-probs of every position of `prompt`."""
    if mode == "prompt_logprobs":
        return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": TOPK}
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": 0,
        "temperature": 0.0,
        "echo": True,
        "logprobs": TOPK,
        "return_tokens_as_token_ids": True,
    }


def positions(answer: dict[str, Any], mode: str, prompt: list[int]) -> list[tuple[float, Entries] | None]:
    """Per prompt position: (the actual token's log-prob, the top-k entries sorted best first);
    None at position 0 (nothing predicts it). A BadAnswer for one that cannot be true."""
    choice = first_choice(answer)
    out: list[tuple[float, Entries] | None] = []
    if mode == "prompt_logprobs":
        rows = choice.get("prompt_logprobs")
        if not isinstance(rows, list) or len(rows) != len(prompt):
            raise RuntimeError("the server returned no prompt_logprobs for every prompt token")
        for pos, row in enumerate(rows):
            out.append(None if row is None else _prompt_row(row, pos, prompt[pos]))
        return out
    lp = choice.get("logprobs") or {}
    token_lps, tops = (lp.get("token_logprobs"), lp.get("top_logprobs")) if isinstance(lp, dict) else (None, None)
    if (
        not isinstance(token_lps, list)
        or not isinstance(tops, list)
        or len(token_lps) < len(prompt)
        or len(tops) < len(prompt)
    ):
        raise RuntimeError("the server returned no echoed logprobs for every prompt token")
    for pos in range(len(prompt)):
        if token_lps[pos] is None or tops[pos] is None:
            out.append(None)
            continue
        if not isinstance(tops[pos], dict):
            raise BadAnswer(f"the server's top_logprobs at position {pos} are not a map of token to log-prob")
        entries = sorted(((_token_id(k), _logprob(v, pos)) for k, v in tops[pos].items()), key=lambda e: -e[1])
        actual = _logprob(token_lps[pos], pos)
        _at_most_one(entries, prompt[pos], actual, pos)
        if len(entries) > TOPK:  # the actual token was added outside the top-k: not one of them
            entries = [e for e in entries if e[0] != prompt[pos]][:TOPK]
        out.append((actual, entries))
    return out


def _prompt_row(row: Any, pos: int, token: int) -> tuple[float, Entries]:
    """One position of vLLM's prompt_logprobs: {id: {logprob, rank}}, checked."""
    if not isinstance(row, dict) or not all(isinstance(v, dict) for v in row.values()):
        raise BadAnswer(f"the server's prompt_logprobs at position {pos} are not a map of token to {{logprob, rank}}")
    if str(token) not in row:
        raise RuntimeError(f"the server's prompt_logprobs at position {pos} leave out the prompt's own token")
    entries = [(_int_id(k, pos), _logprob(v.get("logprob"), pos), _rank(v.get("rank"), pos)) for k, v in row.items()]
    actual = next(lp for i, lp, _ in entries if i == token)
    _at_most_one([(i, lp) for i, lp, _ in entries], token, actual, pos)
    ranked = sorted(entries, key=lambda e: (e[2], -e[1]))
    return actual, [(i, lp) for i, lp, rank in ranked if rank <= TOPK][:TOPK]


def _logprob(value: Any, pos: int) -> float:
    """A log-prob the server sent: a finite number at most 0 (LOGPROB_SLACK for rounding)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadAnswer(f"the server sent a log-prob that is not a number at prompt position {pos}")
    try:
        lp = float(value)
    except OverflowError:  # an integer of hundreds of digits
        lp = math.inf
    if not math.isfinite(lp) or lp > LOGPROB_SLACK:
        raise BadAnswer(
            f"the server sent a log-prob of {lp!r} at prompt position {pos}: a log-prob is a "
            "finite number at most 0 (a probability is at most 1)"
        )
    return lp


def _rank(value: Any, pos: int) -> int:
    """A rank the server sent (vLLM: 1 for the best; absent: 0, sorted by log-prob)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadAnswer(f"the server sent a rank that is not a whole number >= 0 at prompt position {pos}")
    return value


def _int_id(key: Any, pos: int) -> int:
    """A token id the server named as a map key: digits only."""
    if not isinstance(key, str) or not key.isascii() or not key.isdigit() or len(key) > 12:
        raise BadAnswer(f"the server named a token that is not an id at prompt position {pos}")
    return int(key)


def _at_most_one(entries: Entries, token: int, actual: float, pos: int) -> None:
    """The probabilities of distinct tokens at one position add up to at most 1 (with slack)."""
    seen = dict(entries) | {token: actual}
    if math.fsum(math.exp(lp) for lp in seen.values()) > 1 + LOGPROB_SLACK:  # each lp <= slack: no overflow
        raise BadAnswer(f"the server's probabilities at prompt position {pos} add up to more than 1")


def _token_id(key: str) -> int:
    digits = key[len("token_id:") :] if key.startswith("token_id:") else ""
    if digits.isascii() and digits.isdigit() and len(digits) <= 12:
        return int(digits)
    if digits:
        raise BadAnswer(f"the server named a top token {key[:40]!r}: not `token_id:N`")
    raise RuntimeError(
        f"the server named a top token {key[:40]!r}, not `token_id:N`: it ignores "
        "return_tokens_as_token_ids (use logprobs: prompt_logprobs, or a vLLM server)"
    )


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
            raise RuntimeError(
                f"the server returned {len(top)} top log-probs, not {TOPK} (its max_logprobs "
                f"must be at least {TOPK + 1}: vllm serve --max-logprobs)"
            )
        ids[i] = [t for t, _ in top]
        lps[i] = [lp for _, lp in top]
    return tok, ids, lps


def answer_bytes(body: dict[str, Any]) -> int:
    """The most bytes the answer to `body` (a /v1/completions request) can need: a bound, not an
    estimate (the server's own answers are a tenth of it or less)."""
    prompt = body.get("prompt")
    positions = len(prompt) if isinstance(prompt, list) else 0
    entries = TOPK + 1 if body.get("prompt_logprobs") or body.get("echo") else 0
    return (
        BASE_ANSWER_BYTES
        + positions * entries * BYTES_PER_ENTRY
        + int(body.get("max_tokens") or 0) * BYTES_PER_GENERATED_TOKEN
    )


def score_prompt(
    post: Callable[[dict[str, Any]], Any], model: str, prompt: list[int], mode: str, start: int, n: int
) -> tuple[np.ndarray, ...]:
    """One request: the window arrays of the n positions of `prompt` from `start`."""
    return window_arrays(positions(post(logprob_body(model, prompt, mode)), mode, prompt), start, n)


def generate_body(model: str, prompt: list[int], req: GenerateRequest) -> dict[str, Any]:
    """The /v1/completions request of one generation: greedy, or the request's seeded sampling
    (top_k and seed as vLLM's extra parameters), stopped at its stop strings."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": req.max_gen_toks,
        "stop": list(req.until) or None,
    }
    s: Sampling | None = req.sampling
    # every sampling field set: vLLM's server fills the ones a request leaves out from the model's
    # generation_config.json (a repetition_penalty of 1.05 changes greedy text), and the in-process
    # engine, given explicit SamplingParams, never reads it
    body |= NEUTRAL_SAMPLING
    if s is None:
        body["temperature"] = 0.0
    else:
        body |= {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "seed": s.seed,
        }
    return body


#: the sampling fields at the values that leave the model's distribution as it is
NEUTRAL_SAMPLING: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def first_choice(answer: Any) -> dict[str, Any]:
    """The first choice of a completion answer; a RuntimeError for an answer without one."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise RuntimeError("the server's answer has no choices")
    return choices[0]


def generation(answer: dict[str, Any], max_tokens: int | None = None, max_chars: int | None = None) -> Generation:
    """The text of a completion and the tokens the server says it generated: a BadAnswer for a
    text that is not a string or is longer than `max_chars`, or a token count that is not a
    whole number from 0 to `max_tokens` (what was asked for)."""
    text = first_choice(answer).get("text")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise BadAnswer("the server's completion text is not a string")
    if max_chars is not None and len(text) > max_chars:
        raise BadAnswer(
            f"the server sent {len(text):,} characters for at most {max_tokens} tokens (at most "
            f"{max_chars:,} characters with this tokenizer)"
        )
    usage = answer.get("usage") or {}
    return Generation(text, completion_tokens(usage, max_tokens))


def completion_tokens(usage: Any, max_tokens: int | None) -> int:
    """usage.completion_tokens (0 where the server does not say): a whole number from 0 to
    `max_tokens`, or a BadAnswer."""
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or (max_tokens is not None and n > max_tokens):
        raise BadAnswer(f"the server says it generated {str(n)[:40]} tokens where at most {max_tokens} were asked for")
    return n


def probe_logprobs(client: Any, model: str, mode: str) -> str | None:
    """Ask for the log-probs of a three-token prompt; why they are unusable, or None."""
    from qeval.backends.openai.client import ServerError, Unreachable

    prompt = [1, 2, 3]
    body = logprob_body(model, prompt, mode)
    try:
        window_arrays(positions(client.post("/completions", body, answer_bytes(body)), mode, prompt), 1, 2)
    except (ServerError, Unreachable):
        raise
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return str(exc) or type(exc).__name__
    return None
