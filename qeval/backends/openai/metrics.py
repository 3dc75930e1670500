"""Memory as the server reports it: vLLM's Prometheus `/metrics` (`vllm:cache_config_info`: KV
blocks and block size; `vllm:kv_cache_usage_perc`), and the resident memory of the server's
process tree when qeval launched it. Every figure names its source; what the server does not
say is "not measured"."""

from __future__ import annotations

import re

from qeval.backends.base import MemoryFigure

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value); comments skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


#: a block count or size above this is not a server's (2**40 tokens of KV is a petabyte and more)
_MAX_COUNT = 2**40


def _int(value: str | None) -> int | None:
    """A positive count from a label; None for anything else (a server's /metrics is untrusted)."""
    try:
        n = int(value) if value not in (None, "None") and len(value or "") <= 20 else None
    except ValueError:
        return None
    return n if n is not None and 0 < n <= _MAX_COUNT else None


def server_figures(metrics_text: str | None, max_model_len: int) -> dict[str, MemoryFigure]:
    """kv_cache_tokens (num_gpu_blocks x block_size) and max_concurrency (tokens / max_model_len)
    from vllm:cache_config_info; the pool's usage (vllm:kv_cache_usage_perc) as an extra."""
    if not metrics_text:
        return {}
    samples = parse_prometheus(metrics_text)
    info = next((labels for name, labels, _ in samples if name == "vllm:cache_config_info"), None)
    # a share of the pool: NaN, below 0 or above 1 is no server's reading, and is left out
    usage = [v for name, _, v in samples if name == "vllm:kv_cache_usage_perc" and 0.0 <= v <= 1.0]
    if info is None:
        return {}
    blocks, block = _int(info.get("num_gpu_blocks")), _int(info.get("block_size"))
    if not blocks or not block:
        return {}
    tokens = blocks * block
    if tokens > _MAX_COUNT:
        return {}
    line = f"vllm:cache_config_info num_gpu_blocks={blocks} block_size={block}"
    if usage:
        line += f"; vllm:kv_cache_usage_perc={max(usage):g} after scoring"
    source = "server /metrics: vllm:cache_config_info num_gpu_blocks x block_size"
    figures = {"kv_cache_tokens": MemoryFigure(tokens, source, line=line, pool_source="server /metrics")}
    figures["max_concurrency"] = MemoryFigure(
        round(tokens / max_model_len, 2),
        f"{source} / max_model_len {max_model_len}",
        line=f"tokens {tokens} / max_model_len {max_model_len}",
        context=max_model_len,
    )
    if usage:
        figures["kv_cache_usage"] = MemoryFigure(max(usage), "server /metrics: vllm:kv_cache_usage_perc (0..1)")
    return figures


def tree_rss(pid: int) -> int | None:
    """Resident bytes of process `pid` and all its descendants (psutil); None if it is gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in family:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def not_measured(why: str) -> MemoryFigure:
    return MemoryFigure(None, f"not measured: {why}")
