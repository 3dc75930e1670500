"""release_free_memory: the C heap's free pages go back to the OS between chunks of scoring."""

from __future__ import annotations

import sys

import pytest

from qeval.memory import heap


def test_it_answers_a_bool_and_never_raises() -> None:
    assert isinstance(heap.release_free_memory(), bool)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")
def test_on_glibc_it_finds_malloc_trim_and_hands_freed_pages_back() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system")
    assert heap._malloc_trim() is not None
    # every other 64 KiB block freed (under the mmap threshold, so from the arena): holes the heap's
    # top cannot absorb, which only malloc_trim hands back; it says whether it returned any
    blocks = [bytearray(65536) for _ in range(1024)]
    kept = blocks[1::2]
    del blocks
    assert heap.release_free_memory() is True
    assert len(kept) == 512


def test_off_glibc_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    heap._libc.cache_clear()
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert heap._malloc_trim() is None
        assert heap.release_free_memory() is False
        assert heap.set_mmap_threshold() is False
    finally:
        heap._libc.cache_clear()
        heap._malloc_trim.cache_clear()


# In a fresh process (the threshold is process-wide, and the test process's own heap history
# would blur the RSS): free a 16 MiB block (glibc's dynamic threshold rises to 16 MiB), then fill
# and free a 12 MiB one. With the threshold fixed at 8 MiB the 12 MiB block is its own mapping,
# gone from RSS once freed; with glibc's default it comes from the arena and stays resident.
_PROBE = """
import ctypes, os, sys
from qeval.memory import heap
fixed = sys.argv[1] == "fixed"
if fixed:
    assert heap.set_mmap_threshold() is True
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
big = b"\\x01" * (16 << 20); del big
before = rss()
block = b"\\x01" * (12 << 20)
during = rss()
del block
print((during - before) >> 20, (rss() - before) >> 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_a_fixed_mmap_threshold_hands_large_freed_blocks_straight_back() -> None:
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system")

    def probe(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
        during, after = out.stdout.split()
        return int(during), int(after)

    during, after = probe("fixed")
    assert during >= 10 and after <= 1  # resident while held, gone once freed
    during, after = probe("default")
    assert during >= 10 and after >= 10  # the control: glibc's own threshold keeps it in the arena
