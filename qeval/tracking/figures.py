"""What a finished run logs to an experiment tracker, as plain mappings: params, metrics and tags
of the parent run (the run) and of each child run (a setup). Read from results.json alone, so
any tracker (and a test) sees the same figures (docs/tracking.md, "What is logged")."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from qeval.results.schema import Figure, Results, SetupResult

#: the longest param value MLflow stores (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH, 3.x)
MAX_PARAM = 6000
#: the longest param, metric or tag name it stores
MAX_KEY = 250
_BAD_KEY = re.compile(r"[^A-Za-z0-9_./\- :]")


@dataclass
class Logged:
    """One tracker run's content."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def param(self, key: str, value: object) -> None:
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
            if len(text) > MAX_PARAM:  # too long for a param: its hash, the whole is in results.json
                text = f"sha256:{hashlib.sha256(text.encode()).hexdigest()} (longer than {MAX_PARAM} characters)"
            self.params[safe_key(key)] = text

    def metric(self, key: str, value: float | int | None) -> None:
        if value is not None and not isinstance(value, bool) and math.isfinite(value):
            self.metrics[safe_key(key)] = float(value)


def safe_key(key: str) -> str:
    """A name MLflow accepts (letters, digits, `_ - . / :` and spaces, no `..`, no leading `/`,
    at most 250 characters): setup and task names come from results.json, which is untrusted."""
    key = _BAD_KEY.sub("_", key).replace("..", "__").replace("//", "/").strip("/ ")
    return (key or "_")[:MAX_KEY].lstrip(".") or "_"


def _measured(fig: Figure) -> float | int | None:
    return fig.measured if fig.measured is not None else fig.predicted


def parent_run(results: Results, run_dir: str) -> Logged:
    """The run: its provenance as params, the config piece by piece, the decision as tags."""
    info = results.run
    out = Logged(name=f"{info.name} {info.finished or info.started or ''}".strip())
    for key in (
        "name",
        "config_hash",
        "qeval_version",
        "git_commit",
        "device",
        "backend",
        "model_sha256",
        "limit",
        "dtype",
        "dtype_requested",
        "started",
        "finished",
    ):
        out.param(key, getattr(info, key))
    for key, value in results.config.as_dict().items():  # the resolved config, one param per top-level key
        out.param(f"config.{key}", value)
    for key, value in info.hardware.as_dict().items():
        out.param(f"hardware.{key}", value)
    for task, t in results.tasks.items():  # which data each task was scored on: what compare pairs by
        out.param(f"task.{task}.fingerprint", t.fingerprint)
    out.metric("setups_ok", sum(s.status == "ok" for s in results.setups))
    out.metric("setups_failed", sum(s.status != "ok" for s in results.setups))
    rec = results.recommendation
    out.tags |= {"qeval.kind": "run", "qeval.run_dir": run_dir, "qeval.recommendation": rec.setup or "none"}
    if rec.blocked:
        out.tags["qeval.blocked"] = rec.blocked[:1000]
    return out


def child_run(results: Results, setup: SetupResult) -> Logged:
    """One setup: its spec, the model and the versions it ran on as params; its scores, its
    comparison with the baseline, memory and speed as metrics."""
    out = Logged(name=setup.name)
    out.param("setup.spec", setup.spec.as_dict())
    out.param("setup.id", setup.spec.id)
    for key in ("model_sha256", "qeval_version", "config_hash", "backend", "device"):
        out.param(key, getattr(results.run, key))
    for lib, version in setup.library_versions.items():  # the engine's and its libraries' versions
        out.param(f"version.{lib}", version)
    for key, value in setup.quantization.as_dict().items():
        out.param(f"quantization.{key}", value)
    _scores(out, setup)
    _memory(out, setup)
    _performance(out, setup)
    for key, seconds in setup.timings.items():
        out.metric(f"timing.{key}", seconds)
    out.tags |= {
        "qeval.kind": "setup",
        "qeval.setup": setup.name,
        "qeval.status": setup.status,
        "qeval.baseline": str(setup.baseline).lower(),
    }
    if setup.error:
        out.tags["qeval.error"] = setup.error[:1000]
    for flag in setup.flags:
        out.tags[f"qeval.flag.{flag.split(':', 1)[0]}"] = flag[:1000]
    return out


def _scores(out: Logged, setup: SetupResult) -> None:
    for task, score in setup.tasks.items():
        out.metric(f"{task}.n", score.n)
        for name, value in score.metrics.items():
            out.metric(f"{task}.{name}", value.value)
            out.metric(f"{task}.{name}.stderr", value.stderr)
    for task, c in setup.vs_baseline.items():
        out.metric(f"{task}.delta", c.delta)
        out.metric(f"{task}.delta_ci_low", c.ci[0])
        out.metric(f"{task}.delta_ci_high", c.ci[1])
        out.metric(f"{task}.p_value", c.p_value)
        out.metric(f"{task}.p_adjusted", c.p_adjusted)
        out.metric(f"{task}.recovery", c.recovery)
        out.metric(f"{task}.kl", c.kl)
        out.metric(f"{task}.top1_agreement", c.top1_agreement)
        out.metric(f"{task}.flips_to_wrong", c.flips_to_wrong)
        out.metric(f"{task}.flips_to_right", c.flips_to_right)
        if c.verdict:
            out.tags[safe_key(f"qeval.verdict.{task}")] = c.verdict
    for suite, sc in setup.suites.items():
        out.metric(f"suite.{suite}.score", sc.score)
        out.metric(f"suite.{suite}.recovery", sc.recovery)
        if sc.ci is not None:
            out.metric(f"suite.{suite}.recovery_ci_low", sc.ci[0])
            out.metric(f"suite.{suite}.recovery_ci_high", sc.ci[1])


def _memory(out: Logged, setup: SetupResult) -> None:
    m = setup.memory
    out.metric("memory.weights_bytes", _measured(m.weights_bytes))
    out.metric("memory.kv_bytes_per_token", _measured(m.kv_bytes_per_token))
    out.metric("memory.peak_bytes", _measured(m.peak_bytes))
    out.metric("memory.activations_bytes", _measured(m.activations_bytes))
    out.metric("memory.kv_cache_tokens", m.kv_cache_tokens)
    out.metric("memory.max_concurrency", m.max_concurrency)


#: the performance figures logged per concurrency level (their medians)
PERF_FIGURES = (
    "requests_per_s",
    "output_tokens_per_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "e2e_p50_s",
    "e2e_p90_s",
)


def _performance(out: Logged, setup: SetupResult) -> None:
    perf = setup.performance
    if perf is None or perf.status != "ok":
        return
    for level in perf.levels:
        for name in PERF_FIGURES:
            figure: Any = getattr(level, name)
            out.metric(f"perf.c{level.concurrency}.{name}", figure.median)
    for side in ("decode", "prefill"):
        share = getattr(perf, side)
        if share is not None:
            out.metric(f"perf.{side}_share", share.share)
