"""Metric descriptors: what each metric qeval reports means, which direction is better, and
how it is shown. Comparison, gates, recommendation reasons, reports and plots ask the
descriptor instead of testing metric names.

A task's `metric_list` selects which of its kind's metrics it reports; the first is the one
it is compared on. A metric name may carry an lm-evaluation-harness filter after a comma
(`exact_match,flexible-extract`): the descriptor is the part before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from qeval.errors import UserError

#: a native task's output type (lm-eval's tasks add `loglikelihood`)
OutputType = Literal["multiple_choice", "generate_until", "loglikelihood_rolling"]
#: output types whose setups are scored against the baseline's stored top-k (token-level KL and Δp):
#: perplexity texts, and the scored tokens of log-likelihood and multiple-choice tasks
KL_OUTPUT_TYPES = ("loglikelihood_rolling", "multiple_choice", "loglikelihood")


@dataclass(frozen=True)
class Metric:
    """How one metric reads: a proportion (shown in percent, compared in points) or a ratio
    (shown with `digits` decimals in its own unit)."""

    name: str
    higher_is_better: bool
    proportion: bool
    unit: str
    digits: int = 4

    @property
    def scale(self) -> float:
        return 100.0 if self.proportion else 1.0

    def fmt(self, value: float) -> str:
        """The value as reports show it (accuracy 0.953 -> "95.3")."""
        return f"{value * 100:.1f}" if self.proportion else f"{value:.{self.digits}f}"

    def fmt_delta(self, delta: float, unit: bool = True) -> str:
        """A difference as reports show it: points for proportions ("+1.2 pts")."""
        if self.proportion:
            return f"{delta * 100:+.1f}" + (" pts" if unit else "")
        return f"{delta:+.{self.digits}f}"

    def fmt_margin(self, margin: float, relative: bool) -> str:
        """A gate's margin in words ("2 pt", "1% relative", "0.02")."""
        if relative:
            return f"{margin * 100:g}% relative"
        return f"{margin * 100:g} pt" if self.proportion else f"{margin:g}"


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("acc", True, True, "%"),
        Metric("acc_norm", True, True, "%"),
        Metric("exact_match", True, True, "%"),
        Metric("pass_at_k", True, True, "%"),
        Metric("maj_at_k", True, True, "%"),
        Metric("bits_per_byte", False, False, "bits/byte"),
        Metric("token_perplexity", False, False, "perplexity", 3),
        Metric("byte_perplexity", False, False, "perplexity", 4),
        Metric("word_perplexity", False, False, "perplexity", 3),
        Metric("kl_to_baseline", False, False, "nats/token", 5),
        Metric("top1_agreement", True, True, "%"),
    ]
}

#: what each task kind can report, its default metric_list first
KIND_METRICS: dict[str, tuple[str, ...]] = {
    "multiple_choice": ("acc", "acc_norm"),
    "generate_until": ("exact_match",),
    "loglikelihood_rolling": ("bits_per_byte", "token_perplexity"),
}
#: what a sampled task (`repeats: k`) may list beside them: any of its k repeats right (pass@k),
#: its majority answer right (maj@k); not in a default metric_list
SAMPLED_METRICS: dict[str, tuple[str, ...]] = {"generate_until": ("pass_at_k", "maj_at_k")}


def describe(name: str, higher_is_better: bool | None = None) -> Metric:
    """The descriptor of `name` (an lm-eval filter suffix after a comma is ignored). A metric
    qeval has no descriptor for (an lm-eval task's f1, bleu, ...) reads as a plain number, its
    direction as lm-eval declares it (`higher_is_better`, default True)."""
    base = name.split(",", 1)[0]
    if base not in METRICS:
        return Metric(base, True if higher_is_better is None else higher_is_better, False, "")
    return METRICS[base]


def default_compared_metric(output_type: str) -> str:
    """The metric a task kind is compared on when its metric_list does not say."""
    return KIND_METRICS[output_type][0]


def select_metrics(task: str, output_type: str, metric_list: list[dict[str, object]]) -> list[str]:
    """The metrics a task reports, in its metric_list's order (the first is compared on);
    an entry qeval cannot compute for this kind of task is a one-line UserError."""
    if not metric_list:
        return list(KIND_METRICS[output_type])
    names = []
    for entry in metric_list:
        name = entry.get("metric") if isinstance(entry, dict) else None
        offered = KIND_METRICS[output_type] + SAMPLED_METRICS.get(output_type, ())
        if not isinstance(name, str) or name not in offered:
            raise UserError(
                f"task {task}: metric {name!r} is not one qeval computes for {output_type} tasks ({', '.join(offered)})"
            )
        names.append(name)
    return names
