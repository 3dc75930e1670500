"""`qeval plan` from config.json alone (docs/memory.md)."""

from __future__ import annotations

import json

from tests.helpers import MODEL, ROOT, run_cli

DATA = ROOT / "tests" / "data"


def _rows(*args: str) -> dict[str, dict]:
    res = run_cli("plan", *args, "--json")
    assert res.returncode == 0, res.stderr
    return {r["setup"]: r for r in json.loads(res.stdout)["setups"]}


def test_llama2_7b_half_mib_per_token_and_1gib_per_2048() -> None:
    fp16 = _rows("--model", str(DATA / "llama2-7b-config.json"), "--context-len", "2048")["fp16"]
    assert fp16["kv_bytes_per_token"] == 2**19
    assert fp16["kv_bytes_per_token"] * 2048 == 2**30


def test_llama3_8b_gqa_is_a_quarter() -> None:
    l2 = _rows("--model", str(DATA / "llama2-7b-config.json"))["fp16"]
    l3 = _rows("--model", str(DATA / "llama3-8b-config.json"))["fp16"]
    assert l3["kv_bytes_per_token"] * 4 == l2["kv_bytes_per_token"]


def test_quantization_buys_concurrency() -> None:
    rows = _rows("--model", str(DATA / "llama3-8b-config.json"), "--gpu-gib", "24", "--context-len", "4096")
    assert rows["int4"]["max_concurrency"] > rows["int8"]["max_concurrency"] > rows["fp16"]["max_concurrency"]
    assert rows["fp16-kv-fp8"]["kv_cache_tokens"] > 1.9 * rows["fp16"]["kv_cache_tokens"]
    assert rows["fp16"]["max_concurrency"] == round(rows["fp16"]["kv_cache_tokens"] / 4096, 2)


def test_plan_reads_a_model_folder() -> None:
    assert _rows("--model", str(MODEL))["fp16"]["kv_bytes_per_token"] > 0


def test_unreachable_hub_id_is_one_line() -> None:
    res = run_cli("plan", "--model", "no-such-org/no-such-model")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
