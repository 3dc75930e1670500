"""Tokenisation conventions shared by every backend: lm-evaluation-harness 0.4.x (`HFLM` with
its default arguments), so that qeval's log-likelihoods equal lm-eval's on the same model.

- Text is encoded with the tokenizer's own default special tokens (`add_bos_token=None` in
  lm-eval): a Llama-2 tokenizer prepends BOS, SmolLM2's and GPT-2's prepend nothing.
- The *prefix token* conditions what has no context: BOS if the tokenizer has one, else EOS
  (`HFLM.prefix_token_id`). Rolling log-likelihood scores every token of the document, the
  first one predicted from the prefix token; an empty multiple-choice context is the prefix.
- No double BOS: a text that already starts with the prefix token's text (a chat template
  that writes `<|begin_of_text|>` itself) is encoded without special tokens (`HFLM.tok_encode`'s
  `has_bos_prefix`); a generation prompt likewise when it starts with the BOS token's text
  (`HFLM.tok_batch_encode`, which tests `bos_token`, not the prefix token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class Conventions:
    """How one tokenizer is driven: `encode` as lm-eval's `tok_encode` (default special
    tokens, none where the text starts with the prefix token), `encode_plain` without special
    tokens, the prefix token id, and `encode_prompt` as `tok_batch_encode` (generation)."""

    encode: Encode
    encode_plain: Encode
    prefix_token_id: int
    encode_prompt: Encode | None = None

    def prompt(self, text: str) -> list[int]:
        """A generation prompt's tokens (`encode_prompt`, else `encode`)."""
        return (self.encode_prompt or self.encode)(text)


def conventions(tok: Any) -> Conventions:
    """lm-eval's conventions for a Hugging Face tokenizer."""
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if prefix is None:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token: no prefix token for scoring")
    prefix_text = tok.decode(int(prefix))
    bos_text = tok.bos_token if isinstance(tok.bos_token, str) else None

    def encode(s: str) -> list[int]:
        return list(tok(s, add_special_tokens=not (prefix_text and s.startswith(prefix_text))).input_ids)

    def encode_prompt(s: str) -> list[int]:
        return list(tok(s, add_special_tokens=not (bos_text and s.startswith(bos_text))).input_ids)

    return Conventions(
        encode=encode,
        encode_plain=lambda s: tok(s, add_special_tokens=False).input_ids,
        prefix_token_id=int(prefix),
        encode_prompt=encode_prompt,
    )


def encode_pair(
    conv: Conventions, context: str, continuation: str, encode: Encode | None = None
) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as lm-eval splits them: trailing context whitespace
    moves to the continuation, whose tokens are those of encode(context + continuation) past
    encode(context); an empty context is the prefix token (`LM.loglikelihood`). `encode`
    replaces `conv.encode` (a memoized copy)."""
    enc = encode or conv.encode
    if context == "":
        cont = conv.encode_plain(continuation)
        if cont and cont[0] == conv.prefix_token_id:
            return cont[:1], cont[1:]
        return [conv.prefix_token_id], cont
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = enc(context + continuation)
    ctx = enc(context)
    # a context of spaces alone encodes to nothing on tokenizers without BOS: condition on the prefix
    return (ctx or [conv.prefix_token_id]), whole[len(ctx) :]


def memoized(encode: Encode) -> Encode:
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


def generation_context(tokens: list[int], max_length: int, max_gen_toks: int) -> list[int]:
    """The prompt tokens a generation keeps: the *last* ones, leaving room for max_gen_toks
    new tokens, and at least one. (`tokens[-(max_length - max_gen_toks):]` kept the wrong end,
    or everything, when max_gen_toks >= max_length.)"""
    keep = max(max_length - max_gen_toks, 1)
    return tokens[-keep:]


def rolling_windows(tokens: list[int], prefix_token_id: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's `get_rolling_token_windows` + `make_disjoint_window` with context_len=1:
    (context, predicted) pairs covering every token of `tokens` once, the first window
    conditioned on the prefix token."""
    if not tokens:
        return []
    first = min(max_length, len(tokens))
    windows = [([prefix_token_id], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, max_length)
        end = predicted + n
        ctx = tokens[max(end - max_length - 1, 0) : end - 1]
        windows.append((ctx[: len(ctx) - (n - 1)], tokens[end - n : end]))
        predicted += n
    return windows
