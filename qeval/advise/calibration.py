"""The calibration slice: documents the sensitivity is measured on, as token ids.

From a named text file (plain text: one document per blank-line-separated paragraph; JSON
Lines: each line's `text` field) or from the config's own perplexity task (its documents,
checksum-verified as a run reads them). The slice is split in two: the first `n_calib`
documents measure the sensitivity, the next `n_heldout` check the chosen mix (the
advisor-vs-random comparison is made on documents the search never saw)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval.config import RunConfig
from qeval.errors import UserError
from qeval.files.jsonl import read_objects
from qeval.tasks.native.tasks import load_task


@dataclass(frozen=True)
class Slice:
    """Token ids per document, each starting with the prefix token (lm-eval's rolling
    convention, backends/tokens.py), truncated to the model's context."""

    source: str  # what the documents came from, for the report
    calib: list[list[int]]
    heldout: list[list[int]]

    @property
    def calib_tokens(self) -> int:
        return sum(len(d) - 1 for d in self.calib)


def read_texts(cfg: RunConfig, text: Path | None) -> tuple[str, list[str]]:
    """The documents' texts and where they came from."""
    if text is not None:
        if not text.is_file():
            raise UserError(f"--text: {text} is not a file")
        if text.suffix == ".jsonl":
            docs = [obj.get("text") for _, obj in read_objects(text)]
            if not all(isinstance(d, str) for d in docs):
                raise UserError(f"--text: {text}: every JSON line needs a string field `text`")
            texts: list[str] = docs  # type: ignore[assignment]  # checked just above
        else:
            try:
                raw = text.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UserError(f"--text: {text} is not UTF-8 text") from None
            texts = [p.strip() for p in raw.split("\n\n")]
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise UserError(f"--text: {text} holds no text")
        return str(text), texts
    for name in cfg.tasks:
        task = load_task(name, Path(cfg.tasks_dir))
        if task.output_type == "loglikelihood_rolling":
            return f"task {name}", [task.text(doc) for doc in task.docs]
    raise UserError(
        "the config has no perplexity task (output_type loglikelihood_rolling) to calibrate on; "
        "name a text file with --text"
    )


def make_slice(source: str, texts: list[str], tok: Any, *, n_calib: int, n_heldout: int, max_len: int) -> Slice:
    """Encode the first n_calib + n_heldout documents (too few documents: UserError)."""
    if len(texts) < n_calib + max(n_heldout, 0):
        raise UserError(
            f"{source}: {len(texts)} documents, fewer than --calib-docs {n_calib} + --heldout-docs {n_heldout}"
        )
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    docs = []
    for t in texts[: n_calib + n_heldout]:
        ids = tok(t).input_ids
        if not ids or ids[0] != prefix:
            ids = [prefix, *ids]
        docs.append(ids[:max_len])
    docs = [d for d in docs if len(d) > 1]
    return Slice(source, docs[:n_calib], docs[n_calib:])
