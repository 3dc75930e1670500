"""vLLM tensor and pipeline parallelism: the engine arguments for more than one GPU
come from the same translation table as everything else (pure: no engine starts; multi-GPU
runs are untested on this project's machines, which have no GPU)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from qeval.backends.vllm import support as vllm_support
from qeval.config import load_config
from qeval.config.setups import Setup
from tests.helpers import ROOT, write_config

BASE = dict(dtype="bfloat16", max_model_len=4096, utilization=0.9, max_num_seqs=64, enforce_eager=True, seed=1234)


def _args(tp: int, pp: int = 1, setup: Setup | None = None) -> dict[str, Any]:
    return vllm_support.engine_args(
        "org/Model-70B",
        setup or Setup(name="fp16"),
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        **BASE,  # type: ignore[arg-type]
    )


def test_one_gpu_asks_for_no_distributed_backend() -> None:
    args = _args(1)
    assert args["tensor_parallel_size"] == 1
    assert "pipeline_parallel_size" not in args and "distributed_executor_backend" not in args


def test_tensor_parallel_on_one_node_is_driven_by_the_worker() -> None:
    """One qeval worker process drives the group on the GPUs its Ray job reserved: vLLM's
    multiprocessing backend, not its Ray one (which would place workers of its own)."""
    args = _args(4)
    assert args["tensor_parallel_size"] == 4 and args["distributed_executor_backend"] == "mp"
    assert "pipeline_parallel_size" not in args


def test_pipeline_stages_across_nodes_use_vllms_ray_backend() -> None:
    args = _args(8, 2, Setup(name="fp8", weights="fp8", kv_cache="fp8"))
    assert args["tensor_parallel_size"] == 8 and args["pipeline_parallel_size"] == 2
    assert args["distributed_executor_backend"] == "ray"
    assert args["quantization"] == "fp8" and args["kv_cache_dtype"] == "fp8"  # the rest of the table still applies


@pytest.mark.parametrize(
    ("tp", "pp", "backend"), [(1, 1, None), (2, 1, "mp"), (8, 1, "mp"), (1, 2, "ray"), (4, 4, "ray")]
)
def test_distributed_backend_table(tp: int, pp: int, backend: str | None) -> None:
    assert vllm_support.distributed_backend(tp, pp) == backend


def test_the_backend_passes_the_config_to_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """VLLMBackend.load() on a config with TP 4 x PP 2: the `vllm.LLM` call gets both sizes and
    the Ray backend (a stand-in `vllm` module records the call: no engine exists here)."""
    from qeval.backends.vllm.backend import VLLMBackend

    seen: dict[str, Any] = {}

    class _Called(Exception):
        pass

    def llm(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Called

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=llm))
    from tests.helpers import BASELINE, config_dict

    body = config_dict(
        backend="vllm",
        device="cuda",
        engine={"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
        setups=[BASELINE],
        batch_size=None,
        gates=None,
        performance=None,
    )
    cfg = load_config(write_config(tmp_path / "c.yaml", body))
    with pytest.raises(_Called):
        VLLMBackend(cfg, cfg.setups[0], "cuda").load()
    assert seen["tensor_parallel_size"] == 4 and seen["pipeline_parallel_size"] == 2
    assert seen["distributed_executor_backend"] == "ray"


def test_the_gpu_example_config_still_asks_for_one_gpu() -> None:
    cfg = load_config(ROOT / "configs" / "gpu-llama3-8b.yaml")
    assert (cfg.engine.tensor_parallel_size, cfg.engine.pipeline_parallel_size) == (1, 1)


def test_the_cluster_example_loads_and_asks_for_a_group_of_four() -> None:
    from qeval.run.executors.resources import JobResources, job_resources
    from qeval.sweep.config import load_sweep

    sweep = load_sweep(ROOT / "configs" / "cluster-example.yaml")
    assert sweep is not None and list(sweep.configs) == ["base", "community-awq"]
    for cfg in sweep.configs.values():
        assert cfg.executor.kind == "ray" and job_resources(cfg, "cuda") == JobResources(1.0, num_gpus=4)
        for setup in cfg.setups:
            vllm_support.validate(setup, "cuda")
            args = vllm_support.engine_args(
                cfg.model.path,
                setup,
                dtype=cfg.model.dtype,
                max_model_len=8192,
                utilization=0.9,
                max_num_seqs=64,
                tensor_parallel_size=4,
                enforce_eager=True,
                seed=cfg.seed,
            )
            assert args["tensor_parallel_size"] == 4 and args["distributed_executor_backend"] == "mp"
