"""Handing the C heap's free pages back to the operating system between chunks of scoring.

glibc's malloc keeps what torch and numpy free (a batch's activations and logits, a chunk's
top-k) in its arenas, and raises its mmap threshold each time a large block is freed, so later
large blocks come from the arenas too. Nothing is held, yet the process's RSS, and with it the
measured peak (getrusage), climbed with every chunk of documents: a SmolLM2 worker scoring
HellaSwag went from 1,410 MiB after 250 documents to 1,649 MiB after 1,500, while its Python
heap (tracemalloc) stayed at 88 MiB. With `malloc_trim(0)` after each chunk it stays at
1,114-1,123 MiB (docs/benchmarks.md, "Memory at scale")."""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has: its C library's among them
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Collect Python's unreachable cycles, then return the C heap's free pages to the OS.
    True where memory was handed back (glibc says so), False where it could not be (no
    malloc_trim, or nothing to return)."""
    gc.collect()
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
