"""The workload and the plan (docs/performance.md, "The workload and the plan"): the trace
readers, the described distribution, the `workload:` config block, and `qeval plan --workload`'s
max-model-len, refused share, KV blocks and prefix savings against hand-computed numbers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from qeval.config.run import load_config
from qeval.config.workload import WorkloadSpec
from qeval.errors import UserError
from qeval.memory.planner import PlanRow
from qeval.memory.workload_plan import serving_rows, workload_source
from qeval.workload.draw import draw
from qeval.workload.stats import nearest_rank, summarize
from qeval.workload.tokens import TokenCounter
from qeval.workload.trace import MAX_TRACE_BYTES, read_trace
from tests.helpers import MODEL, ROOT, TASKS, one_line_exit_2, run_cli

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SHIPPED = ROOT / "configs" / "workloads" / "gsm8k.jsonl"

#: totals 15, 32, 33, 19; line 3 shares line 2's 16-token prefix (one 16-token block)
TINY = [
    {"input_tokens": 10, "output_tokens": 5},
    {"input_tokens": 20, "output_tokens": 12, "prefix_id": "sys", "prefix_tokens": 16},
    {"input_tokens": 30, "output_tokens": 3, "prefix_id": "sys", "prefix_tokens": 16},
    {"input_tokens": 14, "output_tokens": 5},
]


def _write(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tok() -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL))


def test_nearest_rank_by_hand() -> None:
    values = list(range(1, 101))  # 1..100: the p-th percentile is p itself
    assert [nearest_rank(values, p) for p in (50, 57, 90, 99, 100)] == [50, 57, 90, 99, 100]
    assert nearest_rank([15, 19, 32, 33], 50) == 19  # rank ceil(2.0) = 2
    assert nearest_rank([15, 19, 32, 33], 51) == 32  # rank ceil(2.04) = 3


def test_plan_maths_on_a_tiny_trace(tmp_path: Path) -> None:
    trace = read_trace(_write(tmp_path / "t.jsonl", TINY))
    assert trace.format == "qeval" and [r.total for r in trace.requests] == [15, 32, 33, 19]
    at99 = summarize(trace, 99, 16)
    # p99 of 4 requests is the 4th smallest, 33: two blocks and one token -> 3 blocks -> 48
    assert (at99.percentile_tokens, at99.max_model_len, at99.refused, at99.refused_share) == (33, 48, 0, 0.0)
    # blocks ceil(15/16), ceil(32/16), ceil(33/16), ceil(19/16) = 1, 2, 3, 2
    assert (at99.blocks.mean, at99.blocks.at_percentile, at99.blocks.max) == (2.0, 3, 3)
    assert at99.prefix is not None
    # line 3 reuses line 2's prefix: 16 // 16 = 1 block of 8; (8 - 1) / 4 per request
    assert (at99.prefix.groups, at99.prefix.requests_sharing, at99.prefix.blocks_saved) == (1, 1, 1)
    assert (at99.prefix.share_saved, at99.prefix.mean_blocks_with_cache) == (0.125, 1.75)
    at50 = summarize(trace, 50, 16)
    # p50 is the 2nd smallest, 19 -> 2 blocks -> 32; 33 is refused: 1 of 4
    assert (at50.percentile_tokens, at50.max_model_len, at50.refused, at50.refused_share) == (19, 32, 1, 0.25)
    assert (at50.blocks.mean, at50.blocks.max) == (round(5 / 3, 2), 2)
    assert at50.prefix is not None and at50.prefix.requests_sharing == 0  # the sharer was refused
    # the model's context holds max-model-len down: 33 tokens, context 40 -> 40, not 48
    assert summarize(trace, 99, 16, context=40).max_model_len == 40


def test_concurrency_from_the_pool_in_blocks(tmp_path: Path) -> None:
    stats = summarize(read_trace(_write(tmp_path / "t.jsonl", TINY)), 99, 16)
    row = PlanRow("fp16", 0, 0, kv_cache_tokens=1600 + 15, max_concurrency=0.0, fits=True)  # 100 whole blocks
    (r,) = serving_rows([row], stats)
    assert r.pool_blocks == 100
    assert r.worst_case_concurrency == round(100 / 3, 2)  # 48 tokens = 3 blocks each
    assert r.concurrency_mean == 50.0 and r.concurrency_at_percentile == round(100 / 3, 2)
    assert r.concurrency_with_prefix_cache == round(100 / 1.75, 2)


def test_text_prompts_are_counted_with_the_models_tokenizer(tmp_path: Path) -> None:
    rows = [{"prompt": "What is 2 + 2?", "output_tokens": 4}, {"prompt": "x", "input_tokens": 9, "output_tokens": 1}]
    trace = read_trace(_write(tmp_path / "t.jsonl", rows), counter=TokenCounter(str(MODEL)))
    assert trace.requests[0].input_tokens == len(_tok()("What is 2 + 2?").input_ids)
    assert trace.requests[1].input_tokens == 9  # a count given is taken as it is
    with pytest.raises(UserError, match=r"t.jsonl:1: prompt text needs the model's tokenizer"):
        read_trace(tmp_path / "t.jsonl")


def test_sharegpt_array_and_lines(tmp_path: Path) -> None:
    convs = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "alone"}]},  # no answer: skipped
        {
            "conversations": [
                {"from": "gpt", "value": "I am a bot"},
                {"from": "human", "value": "Sum 1 and 2"},
                {"from": "gpt", "value": "3"},
            ]
        },
    ]
    tok = _tok()
    # as vLLM's ShareGPTDataset reads them: turns 0 and 1, whoever speaks (issue 54: the reader
    # took the first human turn followed by a gpt turn, "Sum 1 and 2" and "3" here)
    expected = [
        (len(tok("Hi there").input_ids), len(tok("Hello!").input_ids)),
        (len(tok("I am a bot").input_ids), len(tok("Sum 1 and 2").input_ids)),
    ]
    (tmp_path / "s.json").write_text(json.dumps(convs))
    for path in (tmp_path / "s.json", _write(tmp_path / "s.jsonl", convs)):
        trace = read_trace(path, counter=TokenCounter(str(MODEL)))
        assert trace.format == "sharegpt" and trace.skipped == 1
        assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == expected
    (tmp_path / "bad.json").write_text(
        json.dumps([convs[0], {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""}]}])
    )
    with pytest.raises(UserError, match=r"bad.json: entry 2: the second turn \(the answer\) is empty"):
        read_trace(tmp_path / "bad.json", counter=TokenCounter(str(MODEL)))


def test_vllm_custom_dataset(tmp_path: Path) -> None:
    """vLLM's custom dataset: `prompt` a line, other keys ignored, every request `--custom-output-len` tokens."""
    path = _write(tmp_path / "c.jsonl", [{"prompt": "capital of India?", "category": "geo"}, {"prompt": "of Iran?"}])
    trace = read_trace(path, counter=TokenCounter(str(MODEL)))
    tok = _tok()
    assert trace.format == "vllm-custom"
    assert [r.input_tokens for r in trace.requests] == [
        len(tok("capital of India?").input_ids),
        len(tok("of Iran?").input_ids),
    ]  # no chat template
    assert {r.output_tokens for r in trace.requests} == {256}  # vLLM's default
    assert {
        r.output_tokens for r in read_trace(path, "vllm-custom", TokenCounter(str(MODEL)), custom_output_len=7).requests
    } == {7}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"input_tokens": 5, "output_tokens": 3', "not a JSON line"),
        ('{"input_tokens": 0, "output_tokens": 3}', "zero or negative length"),
        ('{"input_tokens": 5, "output_tokens": -2}', "zero or negative length"),
        ('{"input_tokens": 250, "output_tokens": 10}', "longer than the model's context (256 tokens)"),
        ('{"input_tokens": 5, "output_tokens": 2.5}', "not a whole number"),
        ('{"input_tokens": 5, "output_tokens": 3, "output_token": 3}', "unknown key 'output_token'"),
        ('{"input_tokens": 5, "output_tokens": 3, "prefix_tokens": 2}', "prefix_tokens without prefix_id"),
        ('{"input_tokens": 5, "output_tokens": 3, "prefix_id": "s", "prefix_tokens": 6}', "more than the prompt's"),
        ('{"input_tokens": 5, "output_tokens": 3, "arrival_s": 1}', "arrival_s on some requests only"),
        ("[" * 100_000, "nested too deep"),
    ],
)
def test_a_bad_line_is_one_error_naming_it(tmp_path: Path, line: str, why: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input_tokens": 5, "output_tokens": 3}\n\n' + line + "\n")
    with pytest.raises(UserError) as err:
        read_trace(path, context=256)
    assert str(err.value).startswith(f"{path}:3: ") and why in str(err.value) and "\n" not in str(err.value)


def test_a_trace_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        f.truncate(MAX_TRACE_BYTES + 1)
    with pytest.raises(UserError, match="byte limit for a trace"):
        read_trace(path)


def test_a_bad_trace_through_the_cli_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", TINY)
    path.write_text(path.read_text() + '{"input_tokens": 5, "output_tokens": 0}\n')
    res = run_cli("plan", "--model", str(MODEL), "--workload", str(path))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"qeval: error: {path}:5: output_tokens 0: a length must be positive (zero or negative length)"
    ]


def test_plan_workload_text_and_json(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", TINY)
    res = run_cli("plan", "--model", str(MODEL), "--workload", str(path), "--json", "--percentile", "50")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    w = out["workload"]
    assert (w["requests"], w["percentile_tokens"], w["max_model_len"], w["refused"], w["refused_share"]) == (
        4,
        19,
        32,
        1,
        0.25,
    )
    assert w["total"] == {"p50": 19, "p90": 33, "p95": 33, "p99": 33, "max": 33, "mean": 24.75}
    fp16 = next(r for r in out["setups"] if r["setup"] == "fp16")
    row = next(r for r in w["setups"] if r["setup"] == "fp16")
    # the plan's rows are at a context of max-model-len; the pool is their KV tokens in 16-token blocks
    assert row["pool_blocks"] == fp16["kv_cache_tokens"] // 16
    assert row["worst_case_concurrency"] == round(row["pool_blocks"] / 2, 2)
    assert row["concurrency_mean"] == round(row["pool_blocks"] / round(5 / 3, 2), 2)
    text = run_cli("plan", "--model", str(MODEL), "--workload", str(path))
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "max-model-len 48: p99 of prompt + output (33 tokens) rounded up" in flat
    assert "it refuses 0 of 4 requests (0.0%)" in flat and "1 blocks saved (12.5% of the blocks)" in flat


def _config(tmp_path: Path, workload: object) -> Path:
    raw: dict[str, object] = {
        "name": "wl",
        "model": {"path": str(MODEL)},
        "tasks": ["addition"],
        "tasks_dir": str(TASKS),
        "setups": [{"name": "fp16"}],
    }
    if workload is not None:
        raw["workload"] = workload
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_workload_block_validates_and_leaves_other_configs_hashed_as_before(tmp_path: Path) -> None:
    _write(tmp_path / "t.jsonl", TINY)
    plain = load_config(_config(tmp_path, None))
    assert "workload" not in plain.as_json()  # a config without the block hashes as it did before it existed
    cfg = load_config(_config(tmp_path, {"trace": "t.jsonl", "slo": {"ttft_ms": 500, "tpot_ms": 50}}))
    assert cfg.workload is not None and cfg.workload.trace == str((tmp_path / "t.jsonl").resolve())
    assert cfg.workload.slo is not None and cfg.workload.slo.percentile == 99
    assert cfg.as_json()["workload"]["slo"]["ttft_ms"] == 500 and cfg.config_hash() != plain.config_hash()
    src = workload_source(_config(tmp_path, {"trace": "t.jsonl"}), None, None)  # `plan --workload CONFIG`
    assert src.run is not None and src.run.model.path == str(MODEL.resolve()) and src.spec.trace
    with pytest.raises(UserError, match="set format and custom_output_len in its workload block"):
        workload_source(tmp_path / "c.yaml", "qeval", None)
    for bad, why in [
        ({"trace": "nope.jsonl"}, "workload.trace"),
        ({"trace": "t.jsonl", "requests": 5}, "requests"),
        ({"input": {"family": "fixed", "value": 5}}, "needs `output`"),
        ({"trace": "t.jsonl", "slo": {"percentile": 90}}, "slo names no target"),
        ({"trace": "t.jsonl", "format": "csv"}, "format"),
        (
            {"input": {"family": "percentiles", "points": {50: 10, 90: 20}}, "output": {"family": "fixed", "value": 1}},
            "percentile 100",
        ),
    ]:
        with pytest.raises(UserError, match=why):
            load_config(_config(tmp_path, bad))


def test_validate_takes_the_block_and_refuses_a_bad_one_in_one_line(tmp_path: Path) -> None:
    res = run_cli(
        "validate",
        str(
            _config(
                tmp_path,
                {"input": {"family": "uniform", "min": 9, "max": 3}, "output": {"family": "fixed", "value": 4}},
            )
        ),
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "workload.input.uniform: min 9 is above max 3" in res.stderr


def test_a_described_distribution_is_drawn_the_same_every_time() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "input": {"family": "lognormal", "median": 100, "sigma": 0.5, "min": 10, "max": 400},
            "output": {"family": "percentiles", "points": {50: 20, 90: 60, 100: 100}, "min": 5},
            "requests": 2000,
            "seed": 7,
            "arrival_rate": 4.0,
        }
    )
    a, b = draw(spec), draw(spec)
    assert a.requests == b.requests
    ins, outs = [r.input_tokens for r in a.requests], [r.output_tokens for r in a.requests]
    assert 10 <= min(ins) and max(ins) <= 400 and 5 <= min(outs) and max(outs) <= 100
    assert 85 <= nearest_rank(sorted(ins), 50) <= 115  # the median, within sampling noise of 2,000 draws
    assert 17 <= nearest_rank(sorted(outs), 50) <= 23 and 55 <= nearest_rank(sorted(outs), 90) <= 65
    times = [r.arrival_s or 0.0 for r in a.requests]
    assert times == sorted(times) and 2000 / times[-1] == pytest.approx(4.0, rel=0.1)
    fixed = WorkloadSpec.model_validate(
        {
            "input": {"family": "fixed", "value": 300},
            "output": {"family": "uniform", "min": 1, "max": 3},
            "requests": 50,
        }
    )
    with pytest.raises(UserError, match="workload: drawn request 1: a request of 30[1-3] tokens"):
        draw(fixed, context=256)


def test_a_workload_yaml_alone_is_read_against_its_folder(tmp_path: Path) -> None:
    _write(tmp_path / "t.jsonl", TINY)
    (tmp_path / "w.yaml").write_text("trace: t.jsonl\nmax_model_len_percentile: 50\n")
    src = workload_source(tmp_path / "w.yaml", None, None)
    assert src.run is None and Path(src.spec.trace or "").is_file() and src.spec.max_model_len_percentile == 50


def test_the_shipped_trace_loads() -> None:
    trace = read_trace(SHIPPED, context=2048)
    stats = summarize(trace, 99, 16, context=2048)
    assert trace.format == "qeval" and 200 <= stats.requests <= 1000
    assert SHIPPED.stat().st_size < 200_000
    assert stats.prefix is not None and stats.prefix.blocks_saved > 0  # its 8-shot requests share their exemplars
    assert stats.refused <= stats.requests // 100 + 1
    block = workload_source(SHIPPED.with_suffix(".yaml"), None, None).spec  # the block that names it
    assert Path(block.trace or "").resolve() == SHIPPED.resolve() and block.slo and block.slo.ttft_ms


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        (
            {
                "workload": {
                    "input": {"family": "fixed", "value": 8},
                    "output": {"family": "fixed", "value": 4},
                    "seed": -1,
                }
            },
            "workload.seed",
        ),
        ({"serving": {"rates": [1], "seed": -1}}, "serving.seed"),
        ({"serving": {"rates": [1], "seed": 2**32}}, "serving.seed"),
    ],
)
def test_a_negative_or_too_large_seed_is_refused_at_validate(
    tmp_path: Path, extra: dict[str, object], where: str
) -> None:
    """Issue 54 point 9: seed -1 passed validate, then plan and goodput crashed in numpy."""
    _write(tmp_path / "t.jsonl", TINY)
    raw = yaml.safe_load(_config(tmp_path, {"trace": "t.jsonl", "slo": {"ttft_ms": 500}}).read_text())
    for key, value in extra.items():
        raw[key] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    res = run_cli("validate", str(tmp_path / "c.yaml"))
    one_line_exit_2(res, where)


def test_plan_workload_config_plans_its_own_setups_each_layer_at_its_precision(tmp_path: Path) -> None:
    """`qeval plan --workload CONFIG` adds the config's setups after the standard rows: a setup that
    keeps layer 0's KV cache at 16 bits costs that layer's 16-bit bytes and the FP8 bytes of the rest."""
    _write(tmp_path / "t.jsonl", TINY)
    cfg = _config(tmp_path, {"trace": "t.jsonl"})
    raw = yaml.safe_load(cfg.read_text())
    raw["setups"] += [{"name": "kv-fp8-keep0", "kv_cache": "fp8", "kv_keep": [0]}]
    cfg.write_text(yaml.safe_dump(raw))
    res = run_cli("plan", "--workload", str(cfg), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    rows = {r["setup"]: r for r in out["setups"]}
    fp16, fp8 = rows["fp16"]["kv_bytes_per_token"], rows["fp16-kv-fp8"]["kv_bytes_per_token"]
    layers = 4  # the shipped tiny model
    assert rows["kv-fp8-keep0"]["kv_bytes_per_token"] == fp8 + (fp16 - fp8) // layers
    # one group, every layer at its own bytes, in whole blocks: on a GPU vLLM raises the block from
    # 16 to 32 tokens so that the FP8 page covers the kept layer's 16-bit page
    blocks = -(-out["workload"]["max_model_len"] // 32)
    assert rows["kv-fp8-keep0"]["kv_bytes_per_sequence"] == rows["kv-fp8-keep0"]["kv_bytes_per_token"] * 32 * blocks
