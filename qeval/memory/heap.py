"""Handing the C heap's free pages back to the operating system between chunks of scoring.

glibc's malloc keeps what torch and numpy free (a batch's activations and logits, a chunk's
top-k) in its arenas, and raises its mmap threshold each time a large block is freed, so later
large blocks come from the arenas too. Nothing is held, yet the process's RSS, and with it the
measured peak (getrusage), climbed with every chunk of documents: a SmolLM2 worker scoring
HellaSwag went from 1,410 MiB after 250 documents to 1,649 MiB after 1,500, while its Python
heap (tracemalloc) stayed at 88 MiB. With `malloc_trim(0)` after each chunk it stays at
1,114-1,123 MiB (docs/benchmarks.md, "Memory at scale").

Trimming between chunks does not touch the high-water inside one: each forward pass frees a
logits block of tens to hundreds of MiB, glibc's dynamic threshold then serves the next one from
the arena, and the arena's high-water grows within a chunk. A fixed mmap threshold
(`set_mmap_threshold`, 8 MiB) maps every such block on its own and unmaps it when it is freed:
on 1,500 HellaSwag documents (SmolLM2 float32, chunks of 500) the worker's peak went from 2,009
to 1,758 MiB at the same speed (205 s), and chunks 2 and 3 peaked no higher than chunk 1."""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
from collections.abc import Callable

MMAP_THRESHOLD_BYTES = 8 << 20
"""Blocks at least this large get their own mapping, handed back to the OS when freed. 8 MiB is
above a batch's activations at typical widths (so ordinary tensors stay in the arena and cost no
syscalls), below one row of a 49,152-word vocabulary's logits over 50 positions (9.4 MiB)."""
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h: mallopt's parameter number for the mmap threshold


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The process's own C library on Linux, None elsewhere (macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)  # the symbols the process already has: its C library's among them
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
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


def set_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `nbytes` for this process (which also turns off its dynamic
    raising): blocks this large are mapped alone and unmapped on free, so large transient
    buffers (a forward pass's logits) never pile up in the arena. True where glibc accepted it,
    False where there is no mallopt (musl, macOS, Windows) or it refused the value."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(nbytes)))
