"""Where the model comes from, resolved once in the main process before any worker starts:
a local folder (with a readable config.json) or a hub id that resolves. A mistyped local path
is not taken for a hub id, and an offline hub is one line, not a minute of retries per setup.

The checksum that keys every stored result is over the *content* of the model's files: a
same-size replacement with an old mtime (`cp -p`) is a different model.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval.errors import UserError


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: `path` as the config gives it, `local_dir` where its config.json
    lives (a hub snapshot for a hub id), and the content checksum."""

    path: str
    local_dir: Path
    checksum: str
    config: dict[str, Any]


def resolve_model(path: str, revision: str | None = None, base: Path | None = None) -> ModelSource:
    """Resolve `path` (already resolved against the config's folder where it exists)."""
    p = Path(path)
    if p.is_dir():
        return ModelSource(path, p, folder_checksum(p), read_model_config(p))
    if p.is_file() and p.suffix == ".gguf":
        return ModelSource(path, p.parent, file_checksum(p), gguf_config(p))
    if _looks_local(path, base):
        raise UserError(f"model path {path} not found (no such folder; a hub id has the form org/name)")
    return _resolve_hub(path, revision)


def _looks_local(path: str, base: Path | None) -> bool:
    """A path that cannot be a hub id, or whose first part is a local folder (`models/x`)."""
    if path.startswith((".", "/", "~")) or path.count("/") != 1 or "\\" in path:
        return True
    first = path.split("/", 1)[0]
    return any((root / first).is_dir() for root in (Path.cwd(), *([base, base.parent] if base else [])))


def _resolve_hub(repo: str, revision: str | None) -> ModelSource:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise UserError(f"model {repo}: not a local folder, and huggingface_hub is not installed") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        config = Path(hf_hub_download(repo, "config.json", revision=revision))
    except LocalEntryNotFoundError:
        why = "the hub is offline (HF_HUB_OFFLINE=1)" if offline else "the hub cannot be reached"
        raise UserError(f"model {repo}: not a local folder, and {why} with no cached copy of it") from None
    except Exception as exc:  # noqa: BLE001 - unknown repo, gated, revision not found: one line for the user
        msg = str(exc).strip().splitlines()
        raise UserError(
            f"model {repo}: cannot resolve it on the hub: {type(exc).__name__}: {msg[0] if msg else ''}"
        ) from None
    # the hub cache keeps files under snapshots/<commit>/: the commit pins the content
    commit = config.parent.name
    return ModelSource(
        repo,
        config.parent,
        hashlib.sha256(f"hub:{repo}@{commit}".encode()).hexdigest(),
        read_model_config(config.parent),
    )


def read_model_config(folder: Path) -> dict[str, Any]:
    """config.json of a model folder, or one line saying what is wrong with it."""
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise UserError(f"model path {folder} has no config.json")
    return read_config_file(cfg)


def read_config_file(cfg: Path) -> dict[str, Any]:
    """A config.json file's object, or one line saying what is wrong with it."""
    try:
        data = json.loads(cfg.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{cfg}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{cfg}: not a JSON object")
    return data


def is_gguf(path: str) -> bool:
    """A GGUF file as `model.path`: transformers dequantizes it on load (the baseline then
    carries the GGUF's own precision, not the original checkpoint's)."""
    return path.endswith(".gguf") and Path(path).is_file()


def gguf_config(path: Path) -> dict[str, Any]:
    """The transformers config a GGUF file describes (needs the `gguf` package)."""
    try:
        import gguf  # noqa: F401
        from transformers import AutoConfig
    except ImportError:
        raise UserError(
            f"model path {path} is a GGUF file: reading it needs the `gguf` package (pip install gguf)"
        ) from None
    try:
        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    except Exception as exc:  # noqa: BLE001 - an unreadable or unsupported GGUF: one line
        raise UserError(
            f"model path {path}: not a GGUF file transformers can read ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def file_checksum(path: Path) -> str:
    """sha256 of one file's content."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def folder_checksum(root: Path) -> str:
    """sha256 over every file's relative path and content (hashlib.file_digest streams it:
    a 16 GB model hashes in tens of seconds, next to hours of scoring)."""
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()
