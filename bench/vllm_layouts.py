"""vLLM's own KV accounting against qeval's, on small random-weight instances of each attention
layout its CPU build runs (`load_format="dummy"`: weights are never read). For each: a 2-layer
model folder written by transformers, an engine started with a fixed KV pool
(`kv_cache_memory_bytes`) and max_model_len L, and its log line "KV cache size: N tokens,
Maximum concurrency for L tokens per request: Yx", against qeval/memory/layouts.py's prediction
of one sequence (blocks x block bytes): Y = floor(pool / block bytes) / blocks per sequence.

Per-layer KV precision across kinds (`--only kv_keep`, or one row: `kv_keep:5`): a 6-layer Gemma 3
style model (5 sliding, 1 full) with an FP8 KV cache and no layer, its full layer, or a sliding
layer kept at bf16 (--kv-cache-dtype-skip-layers, AVX-512 only), against the plan of the same
`kv_keep` setup.

    .venv-vllm/bin/python bench/vllm_layouts.py [--json OUT]      (about half a minute per layout)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
POOL = 64 * 2**20  # bytes of KV pool given to every engine
CONTEXT = 2048
LAYOUTS = {
    "llama (full)": ("llama", {}),
    "mistral (sliding everywhere)": ("mistral", {"sliding_window": 256}),
    "gemma3 (sliding + full)": (
        "gemma3_text",
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 256, "query_pre_attn_scalar": 64},
    ),
    "gpt-oss style (sliding + full, sinks)": (
        "gpt_oss",
        {
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
    ),
    "llama4 style (chunked + full)": (
        "llama4_text",
        {
            "attention_chunk_size": 256,
            "no_rope_layers": [1, 0],
            "num_local_experts": 2,
            "intermediate_size_mlp": 512,
            "interleave_moe_layer_step": 1,
        },
    ),
    "deepseek-v3 style (latent, MLA)": (
        "deepseek_v3",
        {
            "num_key_value_heads": 4,
            "kv_lora_rank": 512,
            "q_lora_rank": 64,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "first_k_dense_replace": 2,
            "moe_intermediate_size": 64,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
    "qwen3-next style (linear attention + full)": (
        "qwen3_next",
        {
            "layer_types": ["linear_attention", "full_attention"],
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
        },
    ),
}
GEMMA6 = {
    "num_hidden_layers": 6,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "sliding_window": 256,
    "query_pre_attn_scalar": 64,
}
#: name -> (model type, config, the layers kept at bf16 beside an FP8 cache): the `kv_keep` rows
KV_KEEP = {
    "gemma3 x6, FP8 KV": ("gemma3_text", GEMMA6, ()),
    "gemma3 x6, FP8 KV, full layer 5 kept": ("gemma3_text", GEMMA6, ("5",)),
    "gemma3 x6, FP8 KV, sliding layer 0 kept": ("gemma3_text", GEMMA6, ("0",)),
}
TOKENIZER = ROOT / "models" / "smollm2-135m"  # `make smollm2`
BASE = {
    "vocab_size": 49152,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_model(folder: Path, model_type: str, extra: dict[str, object]) -> dict[str, object]:
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **(BASE | extra))
    config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # a real tokenizer of this vocabulary size
        shutil.copy(TOKENIZER / name, folder / name)
    return config.to_dict()


def start_engine(folder: Path, keep: tuple[str, ...] | None) -> None:
    """In a child process: vLLM on the folder with dummy weights and the fixed pool (it logs its
    KV cache line at start-up), then exit; with `keep`, an FP8 cache with those layers at bf16."""
    from vllm import LLM

    kv = {} if keep is None else {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": list(keep)}
    LLM(
        **kv,
        model=str(folder),
        load_format="dummy",
        max_model_len=CONTEXT,
        kv_cache_memory_bytes=POOL,
        enforce_eager=True,
        enable_prefix_caching=False,
        dtype="bfloat16",
    )


def engine_figures(folder: Path, keep: tuple[str, ...] | None) -> tuple[int, float, str]:
    """The tokens and concurrency vLLM logged for the folder, from a child process's output
    (vLLM logs to stdout)."""
    kv = [] if keep is None else ["--kv-keep", ",".join(keep) or "none"]
    res = subprocess.run(
        [sys.executable, __file__, "--engine", str(folder), *kv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        # the engine in the child itself: the pool's figures are the same, the start a third as long
        env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    text = res.stdout + res.stderr
    tokens = re.search(r"KV cache size: ([\d,]+) tokens", text)
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    if not tokens or not conc:
        last = [line for line in text.splitlines() if "Error" in line][-1:] or ["no KV cache line in vLLM's log"]
        raise RuntimeError(last[0][:300])
    return int(tokens.group(1).replace(",", "")), float(conc.group(2)), tokens.group(0) + "; " + conc.group(0)


def predicted(config: dict[str, object], keep: tuple[str, ...] | None) -> tuple[float, int]:
    """qeval's concurrency at CONTEXT for POOL bytes, and its bytes per sequence."""
    from qeval.backends.vllm.kv_rule import PagedKv
    from qeval.backends.vllm.support import cache_accounting
    from qeval.config.setups import Setup
    from qeval.memory.layouts import predict_sequence
    from qeval.model.shape import ModelShape

    shape = ModelShape.from_config(config)
    rule = PagedKv(cache_accounting("cpu"))  # vLLM's rule, with this CPU build's cache settings
    setup = Setup(name="bf16") if keep is None else Setup(name="kv", kv_cache="fp8", kv_keep=keep)
    seq = predict_sequence(shape, setup, "bfloat16", CONTEXT, rule)
    blocks = seq.total // seq.block_bytes
    return (POOL // seq.block_bytes) / blocks, seq.total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", default="", help="comma-separated model types to run (default: every layout)")
    ap.add_argument("--engine", type=Path, help=argparse.SUPPRESS)  # the child process's mode
    ap.add_argument("--kv-keep", help=argparse.SUPPRESS)  # the child's FP8 cache and kept layers
    args = ap.parse_args()
    if args.engine:
        keep = None if args.kv_keep is None else tuple(k for k in args.kv_keep.split(",") if k != "none")
        start_engine(args.engine, keep)
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        only = set(filter(None, args.only.split(",")))
        cases = [(n, t, x, None) for n, (t, x) in LAYOUTS.items()] + [(n, *c) for n, c in KV_KEEP.items()]
        for name, model_type, extra, keep in cases:
            row = model_type if keep is None else f"kv_keep:{'+'.join(keep) or 'none'}"
            if (only or keep is not None) and row not in only and not (keep is not None and "kv_keep" in only):
                continue
            folder = Path(tmp) / name.replace(" ", "_").replace(",", "")
            config = write_model(folder, model_type, extra)
            ours, seq = predicted(config, keep)
            try:
                tokens, theirs, line = engine_figures(folder, keep)
            except RuntimeError as exc:  # an architecture this build cannot start is a row, said so
                rows.append({"layout": name, "error": str(exc)})
                print(f"{name:<40} vLLM could not start it: {rows[-1]['error']}")
                continue
            rows.append(
                {
                    "layout": name,
                    "vllm_concurrency": theirs,
                    "vllm_tokens": tokens,
                    "qeval_concurrency": ours,
                    "qeval_sequence_bytes": seq,
                    "line": line,
                }
            )
            print(f"{name:<40} vLLM {theirs:8.2f}x ({tokens:,} tokens)  qeval {ours:8.2f}x  ({seq:,} B per sequence)")
    if args.json:
        args.json.write_text(json.dumps({"pool_bytes": POOL, "context": CONTEXT, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
