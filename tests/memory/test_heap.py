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
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert heap._malloc_trim() is None
        assert heap.release_free_memory() is False
    finally:
        heap._malloc_trim.cache_clear()
