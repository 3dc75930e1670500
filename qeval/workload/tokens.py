"""Token counts of a trace's text, with the model's own tokenizer, loaded only when a request
gives text rather than counts (a trace of counts needs no tokenizer, and no model files).

Every text is bounded before it is tokenized (a fast tokenizer holds about 250 bytes per
character while it works: 8 MB of text took 2 GB and 31 s): at most MAX_TEXT_CHARS characters,
and, where the caller names the most tokens it may have (the model's context), at most twice
that many tokens' worth of the tokenizer's longest token, more than any text of that many
tokens can hold (the factor 2: a normalizer may shorten the text before it is split)."""

from __future__ import annotations

from typing import Any

from qeval.errors import UserError

#: the most characters of one prompt or answer that are tokenized (4 Mi: about 1 GB of a fast
#: tokenizer's memory and 15 s; about a million tokens of English)
MAX_TEXT_CHARS = 2**22
_HINT = "; give input_tokens (a count) instead"


class TokenCounter:
    """Counts prompt and answer tokens as `vllm bench serve` does: `len(tokenizer(text).input_ids)`,
    the tokenizer's special tokens included; a chat prompt rendered by the tokenizer's chat template
    first, where it has one (vLLM's custom dataset unless `--skip-chat-template`)."""

    def __init__(
        self, source: str | None, trust_remote_code: bool = False, revision: str | None = None, why_none: str = ""
    ) -> None:
        self.source, self.trust_remote_code, self.revision = source, trust_remote_code, revision
        #: why there is no tokenizer to load (a GGUF file, no model named), said when text needs one
        self.why_none = why_none
        self._tok: Any = None
        self._longest: int | None = None

    def _tokenizer(self, where: str) -> Any:
        if self._tok is not None:
            return self._tok
        hint = _HINT
        if self.source is None:
            raise UserError(
                f"{where}: prompt text needs the model's tokenizer: {self.why_none or 'no model given'}" + hint
            )
        try:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(
                self.source, trust_remote_code=self.trust_remote_code, revision=self.revision
            )
        except Exception as exc:  # noqa: BLE001 - offline, no tokenizer files, a broken one: one line
            raise UserError(
                f"{where}: prompt text needs the model's tokenizer, which cannot be loaded from "
                f"{self.source} ({type(exc).__name__}){hint}"
            ) from None
        return self._tok

    def _longest_token(self, tok: Any) -> int:
        """The characters of the tokenizer's longest token as its vocabulary spells it (a
        byte-level token spells each byte as one character: never fewer than it decodes to);
        0 where the vocabulary cannot be read (then only MAX_TEXT_CHARS bounds a text)."""
        if self._longest is None:
            try:
                self._longest = max((len(t) for t in tok.get_vocab()), default=0)
            except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no such bound
                self._longest = 0
        return self._longest

    def _bounded(self, text: str, where: str, within: int | None) -> Any:
        """The tokenizer, once `text` is known to be short enough to tokenize: one UserError where
        it is over MAX_TEXT_CHARS, or longer than any text of `within` tokens can be."""
        if len(text) > MAX_TEXT_CHARS:
            raise UserError(
                f"{where}: a text of {len(text):,} characters, over the {MAX_TEXT_CHARS:,}-character "
                f"limit on one prompt or answer{_HINT}"
            )
        tok = self._tokenizer(where)
        longest = self._longest_token(tok) if within is not None else 0
        if within is not None and longest and len(text) > 2 * within * longest:
            raise UserError(
                f"{where}: a text of {len(text):,} characters is longer than the model's context "
                f"({within:,} tokens) can hold: more than twice {within:,} of the tokenizer's longest "
                f"token ({longest} characters)"
            )
        return tok

    def count(self, text: str, where: str, within: int | None = None) -> int:
        """Tokens of `text`, special tokens included; `within`: the most it may have (the
        model's context), a text that cannot fit refused before it is tokenized."""
        return len(self._bounded(text, where, within)(text).input_ids)

    def count_chat(self, text: str, where: str, within: int | None = None) -> int:
        """Tokens of `text` as one user turn under the chat template (plain text where there is
        none), bounded as `count` bounds it (the template only adds to it)."""
        tok = self._bounded(text, where, within)
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        return len(tok(text).input_ids)
