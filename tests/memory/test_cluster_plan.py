"""`qeval plan`'s cluster view: the GPU group each setup needs at the target
context and concurrency, by the one capacity formula, and how many setups run at once."""

from __future__ import annotations

import json
from pathlib import Path

from qeval.backends.vllm.kv_rule import VLLM_SERVE_GPU, PagedKv
from qeval.memory.capacity import Budget, kv_capacity
from qeval.memory.cluster import Cluster, cluster_plan, group_kv_bytes_per_token, layouts
from qeval.memory.ledger import ModelShape, predict_kv_bytes_per_token, predict_weights_bytes
from qeval.memory.planner import PLAN_SETUPS
from tests.helpers import ROOT, run_cli

DATA = ROOT / "tests" / "data"
#: Llama-3-70B's shape (config.json fields): 131 GiB of 16-bit weights
LLAMA3_70B = {
    "vocab_size": 128256,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
}
BUDGET = Budget(gpu_memory_gib=24, utilization=0.9, context_len=4096, overhead_gib=1, margin=0.05)


def _rows(config: dict, cluster: Cluster, concurrency: int = 1) -> tuple[dict, int]:
    rows, at_once = cluster_plan(config, BUDGET, cluster, concurrency, rule=PagedKv(VLLM_SERVE_GPU))
    return {r.setup: r for r in rows}, at_once


def test_an_8b_model_needs_one_gpu_each_and_all_run_at_once() -> None:
    config = json.loads((DATA / "llama3-8b-config.json").read_text())
    rows, at_once = _rows(config, Cluster(nodes=1, gpus_per_node=8))
    assert all(r.gpus == 1 and r.copies_at_once == 8 for r in rows.values())
    assert at_once == len(PLAN_SETUPS) == 7


def test_a_70b_model_needs_groups_and_pipeline_stages_over_nodes() -> None:
    rows, at_once = _rows(LLAMA3_70B, Cluster(nodes=3, gpus_per_node=4), concurrency=4)
    fp16, int4 = rows["fp16"], rows["int4-kv-int4"]
    assert (fp16.tensor_parallel_size, fp16.pipeline_parallel_size, fp16.gpus) == (4, 2, 8)  # 131 GiB > 4 x 21.6
    assert fp16.copies_at_once == 1
    assert (int4.tensor_parallel_size, int4.pipeline_parallel_size, int4.copies_at_once) == (2, 1, 6)
    # two 2-GPU setups share a node, three 4-GPU ones want the other two nodes: 4 at once
    assert at_once == 4


def test_the_group_is_the_smallest_that_fits_by_the_one_formula() -> None:
    shape = ModelShape.from_config(LLAMA3_70B)
    rows, _ = _rows(LLAMA3_70B, Cluster(nodes=1, gpus_per_node=8), concurrency=16)
    for setup in PLAN_SETUPS:
        row = rows[setup.name]
        assert row.tensor_parallel_size is not None
        w, kv = predict_weights_bytes(shape, setup, "float16"), predict_kv_bytes_per_token(shape, setup, "float16")

        assert row.kv_cache_tokens == _capacity(shape, w, kv, row.tensor_parallel_size) >= 16 * 4096
        if row.tensor_parallel_size > 1:
            assert _capacity(shape, w, kv, row.tensor_parallel_size // 2) < 16 * 4096


def _capacity(shape: ModelShape, weights: int, kv: int, tp: int) -> int:
    group = BUDGET.model_copy(update={"gpu_memory_gib": 24 * tp, "overhead_gib": tp})
    sequence = group_kv_bytes_per_token(shape, kv * BUDGET.context_len, tp)  # a uniform model: tokens x context
    return kv_capacity(weights, sequence, group).kv_cache_tokens


def test_kv_heads_are_replicated_past_their_number() -> None:
    shape = ModelShape.from_config(LLAMA3_70B)  # 8 KV heads
    assert group_kv_bytes_per_token(shape, 1000, 8) == 1000
    assert group_kv_bytes_per_token(shape, 1000, 16) == 2000
    tiny = ModelShape.from_config(LLAMA3_70B | {"num_attention_heads": 12, "num_key_value_heads": 12})
    assert layouts(tiny, Cluster(nodes=2, gpus_per_node=8)) == [(1, 1), (2, 1), (4, 1), (4, 2)]  # 8 does not divide 12


def test_a_model_no_group_holds_is_said() -> None:
    rows, at_once = _rows(LLAMA3_70B, Cluster(nodes=1, gpus_per_node=2))
    assert rows["fp16"].gpus is None and rows["fp16"].copies_at_once == 0
    fitting = {n: r.gpus for n, r in rows.items() if r.gpus}
    assert fitting == {"int4": 2, "int4-kv-fp8": 2, "int4-kv-int4": 2}  # only 4-bit weights fit in 2 x 24 GiB
    assert at_once == 1  # each of them takes the node's both GPUs


def test_plan_json_gains_a_cluster_block_only_when_asked(tmp_path: Path) -> None:
    plain = run_cli("plan", "--model", str(DATA / "llama3-8b-config.json"), "--json")
    assert plain.returncode == 0 and set(json.loads(plain.stdout)) == {"setups"}
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_70B))
    res = run_cli(
        "plan",
        "--model",
        str(tmp_path / "config.json"),
        "--json",
        "--gpus-per-node",
        "4",
        "--nodes",
        "3",
        "--concurrency",
        "4",
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [r["setup"] for r in out["setups"]] == [s.name for s in PLAN_SETUPS]  # the single-GPU view unchanged
    c = out["cluster"]
    assert (c["nodes"], c["gpus_per_node"], c["gpu_gib"], c["concurrency"], c["setups_at_once"]) == (3, 4, 24.0, 4, 4)
    assert c["setups"][0] == {
        "setup": "fp16",
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "gpus": 8,
        "kv_cache_tokens": c["setups"][0]["kv_cache_tokens"],
        "max_concurrency": c["setups"][0]["max_concurrency"],
        "copies_at_once": 1,
    }
    table = run_cli("plan", "--model", str(tmp_path / "config.json"), "--gpus-per-node", "4", "--nodes", "3")
    assert "8 (4 x 2)" in table.stdout and "run at once on this cluster" in table.stdout
