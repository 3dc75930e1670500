"""Trace files: the requests of real traffic, in three formats (docs/performance.md, "The workload
and the plan").

- `qeval`: JSON Lines, one request a line: `prompt` (text) or `input_tokens` (a count; taken as
  given where both are), `output_tokens`, and optionally `arrival_s` (seconds from the start,
  non-decreasing, on every line or none), `prefix_id` or `conversation_id` (requests that share
  leading tokens: a system prompt, earlier turns) with `prefix_tokens` (how many), and `id`.
  Any other key is refused (a typo must not pass as an unknown field).
- `sharegpt`: ShareGPT conversations, a JSON array (as ShareGPT_V3 ships) or one per line:
  `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}`. As
  vLLM's ShareGPTDataset reads it (vllm/benchmarks/datasets/datasets.py, vllm 0.32.0): the
  prompt is turn 0's text and the output turn 1's token count, whoever speaks them; an entry of
  fewer than two turns is skipped and counted. vLLM's own sampling filter (prompts of 4 to 1,024
  tokens, outputs of 4 or more, 2,048 in all) is not applied: the plan takes the traffic as it is.
- `vllm-custom`: `vllm bench serve --dataset-name custom`'s JSON Lines, `{"prompt": ...}` a line,
  every request generating `custom_output_len` tokens (vLLM's `--custom-output-len`, default
  256), the prompt rendered by the chat template where the tokenizer has one; other keys are
  ignored, as vLLM's pandas reader ignores them. Checked against vLLM's source at commit 237145ea
  (vllm/benchmarks/datasets/custom.py, arg_utils.py; the layout vllm 0.32.0 ships).

Hostile input: the file is read up to MAX_TRACE_BYTES; a malformed line (a number of more digits
than Python converts included), a length that is not a positive whole number or is over
MAX_TOKENS, a text too long to tokenize (qeval/workload/tokens.py: checked before the tokenizer
runs), or a request longer than the model's context is one UserError naming the file and line
(an entry, in a JSON array)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qeval.config.workload import MAX_TOKENS, VLLM_CUSTOM_OUTPUT_LEN
from qeval.errors import UserError
from qeval.files.jsonl import json_lines
from qeval.workload.tokens import TokenCounter

#: a trace larger than this is refused (ShareGPT_V3's 642 MB file: take a sample of it)
MAX_TRACE_BYTES = 64 * 2**20
QEVAL_KEYS = frozenset(
    {"prompt", "input_tokens", "output_tokens", "arrival_s", "prefix_id", "conversation_id", "prefix_tokens", "id"}
)
MAX_ID_CHARS = 200
#: what a number of more digits than Python converts is called in a refusal
_DIGITS = f"a number of more than {sys.get_int_max_str_digits():,} digits"


@dataclass(frozen=True)
class Request:
    """One request: its prompt and output tokens, and what it shares with others."""

    input_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    #: requests of one group share their first `prefix_tokens` tokens ("prefix:ID" or "conversation:ID")
    group: str | None = None
    prefix_tokens: int = 0

    @property
    def total(self) -> int:
        """Prompt + output: the tokens the request's KV cache holds at its end."""
        return self.input_tokens + self.output_tokens


@dataclass
class Trace:
    """The requests of a workload, in order, and where they came from."""

    requests: list[Request]
    source: str
    format: str
    #: entries a format skips by its own rule (ShareGPT conversations of fewer than two turns)
    skipped: int = 0
    #: how requests arrive: the trace's own times, a Poisson rate, or all at once
    arrivals: str = ""
    notes: list[str] = field(default_factory=list)


def read_trace(
    path: Path,
    fmt: str = "auto",
    counter: TokenCounter | None = None,
    context: int | None = None,
    custom_output_len: int = VLLM_CUSTOM_OUTPUT_LEN,
) -> Trace:
    """The requests of the trace at `path` in format `fmt` (`auto`: from its first entry), each
    checked, none longer than `context` tokens where it is given."""
    counter = counter or TokenCounter(None)
    raw = _read_bounded(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text") from None
    array = text.lstrip().startswith("[")
    if fmt == "auto":
        fmt = "sharegpt" if array else _detect(path, text)
    if fmt not in _PARSERS:
        raise UserError(f"{path}: unknown trace format {fmt!r} (auto, qeval, sharegpt or vllm-custom)")
    if array and fmt != "sharegpt":
        raise UserError(f"{path}: a JSON array, which only the sharegpt format is read as; {fmt} is JSON Lines")
    parse = _PARSERS[fmt]
    read = [
        (where, parse(obj, where, counter, custom_output_len, context))
        for where, obj in (_array_entries(path, text) if array else _lines(path, text))
    ]
    kept = [(where, r) for where, r in read if r is not None]
    skipped = len(read) - len(kept)
    if not kept:
        raise UserError(
            f"{path}: no requests" + (f" ({skipped} conversations of fewer than two turns)" if skipped else "")
        )
    requests = [r for _, r in kept]
    check_requests(requests, [where for where, _ in kept], context)
    timed = requests[0].arrival_s is not None
    arrivals = f"the trace's own times over {requests[-1].arrival_s:g} s" if timed else "none in the trace"
    return Trace(requests, str(path), fmt, skipped, arrivals)


def check_requests(requests: list[Request], wheres: list[str], context: int | None) -> None:
    """What holds across requests: each fits `context`, arrival times on all or none and never
    going back, one prefix length per prefix_id. One UserError naming the first request that breaks it."""
    prefixes: dict[str, int] = {}
    last = 0.0
    for r, where in zip(requests, wheres, strict=True):
        if context is not None and r.total > context:
            raise UserError(
                f"{where}: a request of {r.total:,} tokens (prompt {r.input_tokens:,} + output "
                f"{r.output_tokens:,}) is longer than the model's context ({context:,} tokens)"
            )
        if (r.arrival_s is None) != (requests[0].arrival_s is None):
            raise UserError(f"{where}: arrival_s on some requests only: give it on every line or none")
        if r.arrival_s is not None:
            if r.arrival_s < last:
                raise UserError(
                    f"{where}: arrival_s {r.arrival_s:g} is before the previous request's ({last:g}): "
                    "a trace is in arrival order"
                )
            last = r.arrival_s
        if r.group is not None and r.group.startswith("prefix:"):
            if prefixes.setdefault(r.group, r.prefix_tokens) != r.prefix_tokens:
                raise UserError(
                    f"{where}: prefix_id {r.group.removeprefix('prefix:')!r} has prefix_tokens "
                    f"{r.prefix_tokens}, an earlier request {prefixes[r.group]}: one prefix, one length"
                )


def _read_bounded(path: Path) -> bytes:
    if not path.is_file():
        raise UserError(f"{path}: trace file not found")
    with path.open("rb") as f:
        raw = f.read(MAX_TRACE_BYTES + 1)
    if len(raw) > MAX_TRACE_BYTES:
        raise UserError(f"{path}: over the {MAX_TRACE_BYTES:,}-byte limit for a trace (take a sample of it)")
    return raw


def _lines(path: Path, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`path:line`, object) for each non-blank line; one UserError for a line that is not an object."""
    for lineno, obj in json_lines(path, text, "not a JSON line"):
        yield f"{path}:{lineno}", obj


def _array_entries(path: Path, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not a JSON array ({exc.msg})") from None
    except RecursionError:
        raise UserError(f"{path}: not a JSON array (nested too deep)") from None
    except ValueError:
        raise UserError(f"{path}: not a JSON array ({_DIGITS})") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON array of conversations")
    for i, obj in enumerate(data, 1):
        if not isinstance(obj, dict):
            raise UserError(f"{path}: entry {i}: expected a JSON object, got {type(obj).__name__}")
        yield f"{path}: entry {i}", obj


def _detect(path: Path, text: str) -> str:
    """The format of a JSON Lines trace, from its first entry."""
    for where, obj in _lines(path, text):
        if "conversations" in obj:
            return "sharegpt"
        if "output_tokens" in obj or "input_tokens" in obj:
            return "qeval"
        if "prompt" in obj:
            return "vllm-custom"
        raise UserError(
            f"{where}: cannot tell the trace's format (no output_tokens, input_tokens, prompt or "
            "conversations): give the format"
        )
    raise UserError(f"{path}: no requests")


def _length(obj: dict[str, Any], key: str, where: str) -> int:
    """A positive whole number of tokens."""
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{where}: {key} {value!r:.40} is not a whole number of tokens")
    if value <= 0:
        raise UserError(f"{where}: {key} {value!r:.40}: a length must be positive (zero or negative length)")
    if value > MAX_TOKENS:
        raise UserError(f"{where}: {key} {value!r:.40} is more than a workload's {MAX_TOKENS:,} tokens")
    return value


def _text(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise UserError(f"{where}: {key} is not text")
    if not value:
        raise UserError(f"{where}: {key} is empty (zero length)")
    return value


def _qeval_request(
    obj: dict[str, Any], where: str, counter: TokenCounter, _output_len: int, context: int | None
) -> Request:
    unknown = sorted(set(obj) - QEVAL_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (a qeval trace line has {', '.join(sorted(QEVAL_KEYS))})")
    if "input_tokens" in obj:
        input_tokens = _length(obj, "input_tokens", where)
    elif "prompt" in obj:
        input_tokens = counter.count(_text(obj, "prompt", where), where, context or MAX_TOKENS)
    else:
        raise UserError(f"{where}: needs prompt (text) or input_tokens (a count)")
    if "output_tokens" not in obj:
        raise UserError(f"{where}: needs output_tokens")
    output_tokens = _length(obj, "output_tokens", where)
    group, prefix = _group(obj, where, input_tokens)
    return Request(input_tokens, output_tokens, _arrival(obj, where), group, prefix)


def _arrival(obj: dict[str, Any], where: str) -> float | None:
    if "arrival_s" not in obj:
        return None
    value = obj["arrival_s"]
    try:
        seconds = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer past a float's range
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise UserError(f"{where}: arrival_s {value!r:.40} is not a time in seconds from the start (a number >= 0)")
    return seconds


def _group(obj: dict[str, Any], where: str, input_tokens: int) -> tuple[str | None, int]:
    keys = [k for k in ("prefix_id", "conversation_id") if k in obj]
    if len(keys) == 2:
        raise UserError(f"{where}: give prefix_id or conversation_id, not both")
    if not keys:
        if "prefix_tokens" in obj:
            raise UserError(f"{where}: prefix_tokens without prefix_id or conversation_id: shared with whom?")
        return None, 0
    ident = obj[keys[0]]
    if isinstance(ident, bool) or not isinstance(ident, str | int) or len(str(ident)) > MAX_ID_CHARS or ident == "":
        raise UserError(
            f"{where}: {keys[0]} must be a non-empty string or a whole number (at most {MAX_ID_CHARS} characters)"
        )
    prefix = 0
    if "prefix_tokens" in obj:
        prefix = obj["prefix_tokens"]
        if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
            raise UserError(f"{where}: prefix_tokens {prefix!r:.40} is not a whole number >= 0")
        if prefix > input_tokens:
            raise UserError(f"{where}: prefix_tokens {prefix} is more than the prompt's {input_tokens} tokens")
    return f"{keys[0].removesuffix('_id')}:{ident}", prefix


def _custom_request(
    obj: dict[str, Any], where: str, counter: TokenCounter, output_len: int, context: int | None
) -> Request:
    if "prompt" not in obj:
        raise UserError(f"{where}: needs prompt (vllm bench serve's custom dataset reads a `prompt` on every line)")
    return Request(counter.count_chat(_text(obj, "prompt", where), where, context or MAX_TOKENS), output_len)


def _sharegpt_request(
    obj: dict[str, Any], where: str, counter: TokenCounter, _output_len: int, context: int | None
) -> Request | None:
    """vLLM's ShareGPTDataset: turn 0's text is the prompt and turn 1's the answer, whoever speaks
    them; an entry of fewer than two turns is skipped."""
    turns = obj.get("conversations")
    if not isinstance(turns, list):
        raise UserError(f"{where}: needs conversations, a list of turns")
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            raise UserError(f'{where}: a turn is not {{"from": ..., "value": text}}')
    if len(turns) < 2:
        return None
    ask, answer = turns[0]["value"], turns[1]["value"]
    if not ask:
        raise UserError(f"{where}: the first turn (the prompt) is empty (zero length)")
    if not answer:
        raise UserError(f"{where}: the second turn (the answer) is empty (zero length)")
    within = context or MAX_TOKENS
    prompt, output = counter.count(ask, where, within), counter.count(answer, where, within)
    if min(prompt, output) <= 0:
        raise UserError(f"{where}: the {'prompt' if prompt <= 0 else 'answer'} is no tokens (zero length)")
    return Request(prompt, output)


_PARSERS: dict[str, Callable[[dict[str, Any], str, TokenCounter, int, int | None], Request | None]] = {
    "qeval": _qeval_request,
    "sharegpt": _sharegpt_request,
    "vllm-custom": _custom_request,
}
