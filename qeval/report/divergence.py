"""The report's KL section: each setup's token-level divergence from the baseline on the
perplexity tasks and on the scored tokens of log-likelihood and multiple-choice tasks, in the
form `llama-perplexity --kl-divergence` prints it (mean, median and
upper percentiles of KL; the same-top-1 share; Δp, the change in the actual next token's
probability). Empty for results without it (written before it was kept, or no such task)."""

from __future__ import annotations

from qeval.report.sections import table_section
from qeval.report.tables import Escape
from qeval.results.schema import Results

HEADER = [
    "setup",
    "task",
    "tokens",
    "mean KLD",
    "median",
    "p90",
    "p99",
    "p99.9",
    "max",
    "same top-1",
    "mean Δp",
    "RMS Δp",
    "Δp p1 / p99",
]


def rows(results: Results, esc: Escape) -> list[list[str]]:
    out = []
    for s in results.setups:
        for task, c in s.vs_baseline.items():
            d = c.kl_distribution
            if d is None:
                continue
            dp = (
                ["—", "—", "—"]
                if d.dp_mean is None
                else [
                    f"{100 * d.dp_mean:+.3f}%",
                    f"{100 * (d.dp_rms or 0):.3f}%",
                    f"{100 * (d.dp_p1 or 0):+.2f}% / {100 * (d.dp_p99 or 0):+.2f}%",
                ]
            )
            out.append(
                [
                    esc(s.name),
                    esc(task),
                    f"{d.tokens:,}",
                    f"{d.kl_mean:.5f}",
                    f"{d.kl_median:.5f}",
                    f"{d.kl_p90:.5f}",
                    f"{d.kl_p99:.5f}",
                    f"{d.kl_p99_9:.5f}",
                    f"{d.kl_max:.5f}",
                    f"{100 * d.same_top1:.2f}%",
                    *dp,
                ]
            )
    return out


LEGEND = (
    "Over every scored token of each task (every position of a perplexity text; every continuation token of "
    "every choice of a multiple-choice or log-likelihood task): KL(baseline || setup) in nats on the baseline's "
    "top-16 next tokens plus one tail bucket (a lower bound of the full KL), the share of tokens whose "
    "top-1 prediction is the baseline's, and Δp, the setup's probability of the actual next token minus "
    "the baseline's, in points."
)


SECTION = table_section(
    "KL divergence to the baseline", "kl", "Token-level KL(baseline || setup) and Δp, per task", HEADER, rows, LEGEND
)
