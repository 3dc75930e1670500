"""A workload's numbers and texts are bounded before the work they would cost (issue 54 point 8):
a number of thousands of digits, a prompt too long to tokenize or to fit the context, and
lengths that would overflow the plan where the model's config names no context."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from qeval.config.workload import MAX_TOKENS
from qeval.errors import UserError
from qeval.workload.tokens import MAX_TEXT_CHARS, TokenCounter
from qeval.workload.trace import read_trace
from tests.helpers import MODEL, TASKS, one_line_exit_2, run_cli


class _Tokenizer:
    """A tokenizer whose longest token is 4 characters, a token a character, that must never be
    asked to tokenize a long text."""

    chat_template = None

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "abcd": 1}

    def __call__(self, text: str) -> Any:
        assert len(text) <= 100, f"tokenized {len(text):,} characters"
        return SimpleNamespace(input_ids=list(text))


def _counter() -> TokenCounter:
    counter = TokenCounter("unused")
    counter._tok = _Tokenizer()
    return counter


def test_a_number_of_thousands_of_digits_is_one_line(tmp_path: Path) -> None:
    """Python refuses to convert an integer of over 4,300 digits: a ValueError traceback before."""
    big = "9" * 5000
    lines = tmp_path / "t.jsonl"
    lines.write_text(f'{{"input_tokens": 5, "output_tokens": 3}}\n{{"input_tokens": {big}, "output_tokens": 3}}\n')
    with pytest.raises(UserError, match=r"t.jsonl:2: not a JSON line \(a number of more than 4,300 digits\)"):
        read_trace(lines)
    array = tmp_path / "s.json"
    array.write_text(f'[{{"conversations": [], "n": {big}}}]')
    with pytest.raises(UserError, match=r"s.json: not a JSON array \(a number of more than 4,300 digits\)"):
        read_trace(array)
    timed = tmp_path / "a.jsonl"
    timed.write_text(f'{{"input_tokens": 5, "output_tokens": 3, "arrival_s": 1{"0" * 400}}}\n')
    with pytest.raises(UserError, match=r"a.jsonl:1: arrival_s 1000.* is not a time in seconds"):
        read_trace(timed)  # past a float's range: an OverflowError before
    one_line_exit_2(run_cli("plan", "--model", str(MODEL), "--workload", str(lines)), "4,300 digits")


@pytest.mark.parametrize("where", ["config", "workload"])
def test_a_yaml_number_of_thousands_of_digits_is_one_line(tmp_path: Path, where: str) -> None:
    """PyYAML's int() raised the ValueError through the config loader too: a traceback."""
    big = "9" * 5000
    if where == "config":
        raw = {"name": "wl", "model": {"path": str(MODEL)}, "tasks": ["addition"], "tasks_dir": str(TASKS)}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw) + f"seed: {big}\n")
        res = run_cli("validate", str(tmp_path / "c.yaml"))
    else:
        block = f"input: {{family: fixed, value: {big}}}\noutput: {{family: fixed, value: 1}}\n"
        (tmp_path / "c.yaml").write_text(block)
        res = run_cli("plan", "--model", str(MODEL), "--workload", str(tmp_path / "c.yaml"))
    one_line_exit_2(res, "c.yaml: invalid YAML: a number of more than 4,300 digits")


def test_a_text_is_bounded_before_it_is_tokenized(tmp_path: Path) -> None:
    """8 MB of prompt text took 2 GB and 31 s to tokenize before any bound was checked."""
    counter = _counter()
    with pytest.raises(UserError, match=r"over the 4,194,304-character limit on one prompt or answer"):
        counter.count("x" * (MAX_TEXT_CHARS + 1), "w")
    # 2 x 100 tokens x 4 characters: no text longer fits 100 tokens
    assert counter._bounded("x" * 800, "w", 100) is counter._tok
    with pytest.raises(UserError, match=r"w: a text of 801 characters is longer than the model.s context \(100 "):
        counter.count("x" * 801, "w", 100)
    with pytest.raises(UserError, match=r"longer than the model's context"):
        counter.count_chat("x" * 801, "w", 100)
    rows = [{"prompt": "x" * 801, "output_tokens": 3}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError, match=r"t.jsonl:1: a text of 801 characters"):
        read_trace(path, "qeval", counter, context=100)
    share = tmp_path / "s.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"value": "y" * 801}]}]))
    with pytest.raises(UserError, match=r"s.json: entry 1: a text of 801 characters"):
        read_trace(share, "sharegpt", counter, context=100)


def test_an_eight_megabyte_prompt_is_refused_unread_by_the_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 1_600_000, "output_tokens": 3}) + "\n")
    started = time.monotonic()
    res = run_cli("plan", "--model", str(MODEL), "--workload", str(path))
    one_line_exit_2(res, "t.jsonl:1: a text of 8,000,000 characters, over the 4,194,304-character limit")
    assert time.monotonic() - started < 60


def _no_context_model(tmp: Path) -> Path:
    """The tiny model's config.json alone, without max_position_embeddings."""
    model = tmp / "model"
    model.mkdir()
    config = json.loads((MODEL / "config.json").read_text())
    del config["max_position_embeddings"]
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_lengths_are_bounded_where_no_context_bounds_them(tmp_path: Path) -> None:
    """With no max_position_embeddings, lengths reached 2^63 and overflowed the plan's budget."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"input_tokens": 2**62, "output_tokens": 3}) + "\n")
    model = _no_context_model(tmp_path)
    one_line_exit_2(
        run_cli("plan", "--model", str(model), "--workload", str(path)),
        f"t.jsonl:1: input_tokens {2**62} is more than a workload's {MAX_TOKENS:,} tokens",
    )
    path.write_text(json.dumps({"input_tokens": 5, "output_tokens": MAX_TOKENS}) + "\n")
    res = run_cli("plan", "--model", str(model), "--workload", str(path), "--json")
    assert res.returncode == 0, res.stderr  # at the bound: planned
    assert json.loads(res.stdout)["workload"]["max_model_len"] == MAX_TOKENS + 16


@pytest.mark.parametrize(
    "block",
    [
        {"input": {"family": "fixed", "value": 9 * 10**18}, "output": {"family": "fixed", "value": 4}},
        {"input": {"family": "uniform", "min": 1, "max": MAX_TOKENS + 1}, "output": {"family": "fixed", "value": 4}},
        {
            "input": {"family": "lognormal", "median": 1e18, "sigma": 1, "max": 9},
            "output": {"family": "fixed", "value": 4},
        },
        {
            "input": {"family": "percentiles", "points": {100: 2**40}},
            "output": {"family": "fixed", "value": 4},
        },
        {"trace": "t.jsonl", "custom_output_len": 2**40},
    ],
)
def test_lengths_in_the_workload_block_are_bounded_at_validate(tmp_path: Path, block: dict[str, Any]) -> None:
    (tmp_path / "t.jsonl").write_text('{"input_tokens": 5, "output_tokens": 3}\n')
    raw = {
        "name": "wl",
        "model": {"path": str(MODEL)},
        "tasks": ["addition"],
        "tasks_dir": str(TASKS),
        "setups": [{"name": "fp16"}],
        "workload": block,
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    one_line_exit_2(run_cli("validate", str(tmp_path / "c.yaml")), "less than or equal to 16777216")


def test_arrival_rate_beside_a_trace_is_refused(tmp_path: Path) -> None:
    """It was ignored there (the shipped gsm8k.yaml set one): a trace's requests arrive at its own
    arrival_s, or at seeded Poisson gaps at each serving rate."""
    (tmp_path / "t.jsonl").write_text('{"input_tokens": 5, "output_tokens": 3}\n')
    (tmp_path / "w.yaml").write_text("trace: t.jsonl\narrival_rate: 2.0\n")
    one_line_exit_2(
        run_cli("plan", "--model", str(MODEL), "--workload", str(tmp_path / "w.yaml")),
        "arrival_rate applies to a described distribution only",
    )


def test_a_data_line_number_of_thousands_of_digits_is_one_error(tmp_path: Path) -> None:
    """Task data and calibration text are read by the same JSON Lines reader."""
    from qeval.files.jsonl import read_objects

    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "a"}\n{"q": ' + "9" * 5000 + "}\n")
    with pytest.raises(UserError, match=r"d.jsonl:2: corrupt dataset line \(a number of more than 4,300 digits\)"):
        list(read_objects(path))
