"""Tokenisation conventions shared by every backend (lm-evaluation-harness 0.4.x)."""

from __future__ import annotations

from collections.abc import Callable


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as lm-eval splits them: trailing context whitespace
    moves to the continuation, whose tokens are those of encode(context + continuation)
    past encode(context)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


def memoized(encode: Callable[[str], list[int]]) -> Callable[[str], list[int]]:
    """`encode` with a per-call-site memo: the four choices of a question share a context,
    which is then tokenised once, not eight times (encode_pair encodes it twice)."""
    memo: dict[str, list[int]] = {}

    def cached(text: str) -> list[int]:
        if text not in memo:
            memo[text] = encode(text)
        return memo[text]

    return cached


def truncate(ctx: list[int], cont: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Keep the last max_length+1 tokens (lm-eval), never cutting into the continuation."""
    keep = max_length + 1 - len(cont)
    return (ctx[-keep:] if keep > 0 else ctx[-1:]), cont


def rolling_windows(tokens: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's `get_rolling_token_windows` + `make_disjoint_window` with context_len=1.
    `tokens` starts with BOS, the prefix token: it conditions the first window, unscored."""
    prefix, token_list = tokens[:1], tokens[1:]
    if not token_list:
        return []
    first = min(max_length, len(token_list))
    windows = [(prefix, token_list[:first])]
    predicted = first
    while predicted < len(token_list):
        n = min(len(token_list) - predicted, max_length)
        end = predicted + n
        ctx = token_list[max(end - max_length - 1, 0) : end - 1]
        windows.append((ctx[: len(ctx) - (n - 1)], token_list[end - n : end]))
        predicted += n
    return windows
