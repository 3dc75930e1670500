"""Asking another Python interpreter what it has, without importing it here: vLLM and
llm-compressor live in virtualenvs of their own (they pin other transformers versions)."""

from __future__ import annotations

import subprocess


def has_module(python: str, module: str) -> bool:
    """Whether the interpreter `python` can import `module` (checked without importing it)."""
    return probe(python, f"import importlib.util as u; print(u.find_spec({module!r}) is not None)") == "True"


def probe(python: str, code: str, timeout: int = 120) -> str:
    """What `python -c code` prints (stripped); "" if it cannot run."""
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()
