"""Token counts of a trace's text, with the model's own tokenizer, loaded only when a request
gives text rather than counts (a trace of counts needs no tokenizer, and no model files)."""

from __future__ import annotations

from typing import Any

from qeval.errors import UserError


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

    def _tokenizer(self, where: str) -> Any:
        if self._tok is not None:
            return self._tok
        hint = "; give input_tokens (a count) instead"
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

    def count(self, text: str, where: str) -> int:
        """Tokens of `text`, special tokens included."""
        return len(self._tokenizer(where)(text).input_ids)

    def count_chat(self, text: str, where: str) -> int:
        """Tokens of `text` as one user turn under the chat template (plain text where there is none)."""
        tok = self._tokenizer(where)
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        return len(tok(text).input_ids)
