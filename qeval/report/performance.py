"""The performance parts of the report, from results.json alone: the throughput, latency and
ceiling tables, and the three-sided view (quality x memory x throughput, with the Pareto
front over all three). report/markdown.py and report/html.py render these rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qeval.memory.capacity import whole_sequences
from qeval.perf.phase import WORKLOAD_MARK
from qeval.report.tables import Escape, md_table

if TYPE_CHECKING:
    from qeval.results.performance import Measured, Performance
    from qeval.results.schema import Results


THROUGHPUT_HEADER = ["setup", "concurrency", "requests/s", "output tokens/s", "prefill tokens/s", "decode tokens/s"]
LATENCY_HEADER = [
    "setup",
    "concurrency",
    "TTFT p50 (ms)",
    "TTFT p90 (ms)",
    "TPOT p50 (ms)",
    "TPOT p90 (ms)",
    "request latency p50 (ms)",
    "p90 (ms)",
]
CEILING_HEADER = [
    "setup",
    "decode tokens/s (concurrency 1)",
    "decode ceiling",
    "share",
    "prefill tokens/s",
    "prefill ceiling",
    "share",
]
TRADEOFF_HEADER = [
    "setup",
    "worst accuracy Δ (pts)",
    "weights + KV of one sequence",
    "sequences that fit",
    "output tokens/s at its top level",
    "Pareto-optimal",
]


def has_performance(results: Results) -> bool:
    """Whether the run has a performance phase to show (older results have none: no section)."""
    return results.ceilings is not None or any(s.performance is not None for s in results.setups)


def fmt(m: Measured, scale: float = 1.0, digits: int = 0) -> str:
    """ "1,234 [1,180–1,290]": the median and the range of the repeats."""
    f = f"{{:,.{digits}f}}"
    return f"{f.format(m.median * scale)} [{f.format(m.min * scale)}–{f.format(m.max * scale)}]"


def _perf_setups(results: Results) -> list[tuple[str, Performance]]:
    """(setup name, its performance block) for every setup that has one."""
    return [(s.name, s.performance) for s in results.setups if s.performance is not None]


def throughput_rows(results: Results, esc: Escape) -> list[list[str]]:
    rows = []
    for name, perf in _perf_setups(results):
        if perf.status != "ok":
            rows.append([esc(name), "—", f"failed: {esc(perf.error)}", "", "", ""])
            continue
        for x in perf.levels:
            rows.append(
                [
                    esc(name),
                    str(x.concurrency),
                    fmt(x.requests_per_s, digits=2),
                    fmt(x.output_tokens_per_s),
                    fmt(x.prefill_tokens_per_s),
                    fmt(x.decode_tokens_per_s),
                ]
            )
    return rows


def latency_rows(results: Results, esc: Escape) -> list[list[str]]:
    rows = []
    for name, perf in _perf_setups(results):
        for x in perf.levels if perf.status == "ok" else []:
            rows.append(
                [esc(name), str(x.concurrency)]
                + [
                    fmt(m, 1e3, 1)
                    for m in (x.ttft_p50_s, x.ttft_p90_s, x.tpot_p50_s, x.tpot_p90_s, x.e2e_p50_s, x.e2e_p90_s)
                ]
            )
    return rows


def ceiling_rows(results: Results, esc: Escape) -> list[list[str]]:
    rows = []
    for name, perf in _perf_setups(results):
        if perf.status != "ok" or (perf.decode is None and perf.prefill is None):
            continue
        row = [esc(name)]
        for share in (perf.decode, perf.prefill):
            if share is None:
                row += ["—", "—", "—"]
            else:
                mark = " (> 1: ceiling wrong)" if share.share > 1 else ""
                at = f" (concurrency {share.concurrency})" if share is perf.prefill else ""
                row += [f"{share.achieved:,.0f}{at}", f"{share.ceiling:,.0f}", f"{share.share:.1%}{mark}"]
        rows.append(row)
    return rows


def tradeoff_points(results: Results) -> list[tuple[str, float, int, float]]:
    """(setup, worst accuracy Δ in points, bytes of one sequence, output tokens/s at its top
    level) for every ok setup with performance figures."""
    context = results.config.budget.context_len
    points = []
    for s in results.setups:
        perf = s.performance
        if s.status == "ok" and perf is not None and perf.top is not None:
            points.append(
                (s.name, s.worst_accuracy_delta(), s.sequence_bytes(context), perf.top.output_tokens_per_s.median)
            )
    return points


def pareto3(points: list[tuple[str, float, int, float]]) -> set[str]:
    """Setups no other setup beats on all three sides at once: quality (higher), memory per
    sequence (lower) and throughput (higher), at least as good on each and better on one."""

    def beats(q: tuple[str, float, int, float], p: tuple[str, float, int, float]) -> bool:
        at_least = q[1] >= p[1] and q[2] <= p[2] and q[3] >= p[3]
        return at_least and (q[1] > p[1] or q[2] < p[2] or q[3] > p[3])

    return {p[0] for p in points if not any(beats(q, p) for q in points if q is not p)}


def tradeoff_rows(results: Results, esc: Escape) -> list[list[str]]:
    points = tradeoff_points(results)
    front = pareto3(points)
    by_name = {s.name: s for s in results.setups}
    rows = []
    for name, delta, nbytes, _ in points:
        s = by_name[name]
        perf = s.performance
        assert perf is not None and perf.top is not None
        conc = "—" if s.memory.max_concurrency is None else whole_sequences(s.memory.max_concurrency)
        rows.append(
            [
                esc(name),
                f"{delta:+.1f}",
                f"{nbytes / 2**20:.2f} MiB",
                conc,
                f"{fmt(perf.top.output_tokens_per_s)} at {perf.top.concurrency}",
                "yes" if name in front else "",
            ]
        )
    return rows


def rate_text(value: float, unit: str) -> str:
    """A rate with the SI prefix that shows it: 2.8e8 FLOP/s is "280 MFLOP/s", not "0.00 TFLOP/s"."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def ceilings_text(results: Results) -> str:
    """One line: the device's limits as this run measured them."""
    c = results.ceilings
    if c is None:
        return "Device ceilings: not measured (no successful probe in this run), so no shares of the ceiling."
    peaks = ", ".join(f"{k} matmul {rate_text(m.max, m.unit)} (best of {m.repeats})" for k, m in c.matmul_peak.items())
    return (
        f"Device ceilings, measured once in this run on {c.device} ({c.device_name}, {c.threads} torch threads): "
        f"copy bandwidth {c.copy_bandwidth.max / 1e9:.1f} GB/s (best of {c.copy_bandwidth.repeats}), {peaks}."
    )


def workload_text(results: Results) -> str:
    """One line: the workload, taken from the first setup that timed it."""
    wl = next(
        (
            s.performance.workload
            for s in results.setups
            if s.performance is not None and s.performance.workload is not None
        ),
        None,
    )
    if wl is None:
        return "No setup was timed."
    return (
        f"Workload: {wl.input_len}-token prompts, {wl.output_len} generated tokens per request (end of sequence "
        f"ignored), {wl.num_requests} requests per level served in waves of the level; median of {wl.repeats} "
        f"timed repeats after {wl.warmup} warm-up pass(es), the repeats' range in brackets."
    )


def sources(results: Results) -> list[str]:
    """How the figures were measured, once per distinct source (results.json has each figure's own)."""
    seen: list[str] = []
    for _, perf in _perf_setups(results):
        for x in perf.levels[:1]:
            for label, m in (
                ("throughput", x.requests_per_s),
                ("prefill", x.prefill_tokens_per_s),
                ("decode", x.decode_tokens_per_s),
                ("TTFT", x.ttft_p50_s),
                ("TPOT", x.tpot_p50_s),
                ("request latency", x.e2e_p50_s),
            ):
                text = f"{label} ({results.run.backend}): {m.source.split(' ' + WORKLOAD_MARK)[0]}"
                if text not in seen:
                    seen.append(text)
    return seen


def notes(results: Results) -> list[str]:
    """Each setup's performance notes, a note shared by several setups said once."""
    by_text: dict[str, list[str]] = {}
    for name, perf in _perf_setups(results):
        texts = list(perf.notes)
        if perf.workload and perf.levels:
            texts.append(f"levels {', '.join(str(x.concurrency) for x in perf.levels)} ({perf.workload.levels_source})")
        for text in texts:
            by_text.setdefault(text, []).append(name)
    return [f"{', '.join(names)}: {text}" for text, names in by_text.items()]


#: repeats further apart than this (max / min) mark a setup's timings as taken on a loaded machine
NOISY = 1.5


def noisy_setups(results: Results) -> list[str]:
    """Setups whose output tokens/s repeats, at some level, differ by more than NOISY x."""
    return [
        name
        for name, perf in _perf_setups(results)
        if any(x.output_tokens_per_s.max > NOISY * x.output_tokens_per_s.min for x in perf.levels)
    ]


def markdown_lines(results: Results, esc: Escape) -> list[str]:
    """report.md's "Performance" section; nothing for results without a performance phase."""
    if not has_performance(results):
        return []
    lines = ["## Performance", "", workload_text(results), "", ceilings_text(results), ""]
    lines += [
        "### Quality × memory × throughput",
        "",
        *md_table(TRADEOFF_HEADER, tradeoff_rows(results, esc)),
        "",
        "Pareto-optimal: no other setup is at least as good on all three sides (accuracy, memory per sequence "
        f"at {results.config.budget.context_len} tokens, throughput) and better on one.",
        "",
    ]
    lines += ["### Throughput", "", *md_table(THROUGHPUT_HEADER, throughput_rows(results, esc)), ""]
    noisy = noisy_setups(results)
    if noisy:
        lines += [
            f"The repeats of {esc(', '.join(noisy))} vary by more than {NOISY:g}x (max / min) in output "
            "tokens/s at some level: the machine's load changed while they were timed. Read the medians with "
            "their ranges; a quiet or dedicated machine gives figures to decide on.",
            "",
        ]
    lines += [
        "### Latency",
        "",
        *md_table(LATENCY_HEADER, latency_rows(results, esc)),
        "",
        "TTFT: time to first token; TPOT: time per output token after the first; request latency: submission "
        "to last token. Percentiles over each level's requests, then the median over repeats.",
        "",
    ]
    ceiling = ceiling_rows(results, esc)
    if ceiling:
        lines += [
            "### Share of the ceiling",
            "",
            *md_table(CEILING_HEADER, ceiling),
            "",
            "Decode ceiling: copy bandwidth / (weight bytes read per token + KV bytes at the mean context); "
            "prefill ceiling: matmul peak / (2 x the decoder's linear parameters). Tokens/s; a share over 1 "
            "means the ceiling measurement is wrong for that setup (flagged in the notes).",
            "",
        ]
    how = sources(results) + notes(results)
    if how:
        lines += ["How measured (every figure's source and repeat count are in results.json):", ""]
        lines += [f"- {esc(n)}" for n in how] + [""]
    return lines


def html_context(results: Results) -> dict[str, object] | None:
    """What report.html's performance section renders (Jinja2 escapes it); None without one."""
    if not has_performance(results):
        return None
    return {
        "workload": workload_text(results),
        "ceilings": ceilings_text(results),
        "tables": [
            (
                "Quality × memory × throughput (Pareto-optimal over all three)",
                "tradeoff",
                TRADEOFF_HEADER,
                tradeoff_rows(results, str),
            ),
            ("Throughput", "throughput", THROUGHPUT_HEADER, throughput_rows(results, str)),
            ("Latency", "latency", LATENCY_HEADER, latency_rows(results, str)),
            ("Share of the ceiling", "ceiling", CEILING_HEADER, ceiling_rows(results, str)),
        ],
        "how": sources(results) + notes(results),
        "noisy": ", ".join(noisy_setups(results)),
    }


def terminal_speed_rows(results: Results) -> list[list[str]]:
    """The end-of-run terminal table: per setup, output tokens/s at concurrency 1 and at its
    top level, and TPOT p50 at concurrency 1 (medians; the report has the ranges)."""
    rows = []
    for name, perf in _perf_setups(results):
        one, top = perf.level(1), perf.top
        if perf.status != "ok" or top is None:
            rows.append([name, f"failed: {(perf.error or '')[:50]}", "", ""])
            continue
        rows.append(
            [
                name,
                "—" if one is None else f"{one.output_tokens_per_s.median:,.0f}",
                f"{top.output_tokens_per_s.median:,.0f} at {top.concurrency}",
                "—" if one is None else f"{one.tpot_p50_s.median * 1e3:.1f}",
            ]
        )
    return rows
