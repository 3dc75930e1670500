"""Drill-down from a notebook: a finished run, a few lines away from pandas.

    import qeval
    run = qeval.load_run("reports/demo")
    run.summary()                      # setup x task: score, difference, CI, verdict
    run.flips("int4", "addition")      # what INT4 got wrong that the baseline got right
    run.samples("kv-int2", "facts")    # every sample, with prompt, prediction, log-likelihoods
    run.memory()                       # the ledger, predicted and measured, with sources
    run.advice()                       # an advise: block's per-unit sensitivity and the kept units
    run.performance()                  # throughput and latency per level, median and range, with sources
    run.serving()                      # qeval goodput: goodput, latency percentiles, KV usage per level
    run.generation_positions()         # KL / top-1 / Δ NLL by generated position (generation_divergence:)
    run.generation_lengths()           # accuracy by the baseline's answer length
    run.multi_turn()                   # accuracy and answer KL by question turn (kinds: multi_turn)
    run.plot_quality_vs_memory()       # matplotlib figures

Reads only the stored results; no model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from qeval.errors import UserError
from qeval.records.store import RunStore
from qeval.results.echo import ConfigEcho
from qeval.results.generation import TaskGeneration
from qeval.results.schema import Results, read_results


class SchemaVersionError(ValueError):
    """The run directory was written by a qeval whose results schema this one cannot read."""


class Run:
    """A finished qeval run directory; see the module docstring. `results` is the typed
    results.json (qeval.results.schema.Results)."""

    def __init__(self, path: Path, results: Results) -> None:
        self.path = path
        self.results = results
        self._store = RunStore(path)

    @property
    def config(self) -> ConfigEcho:
        """The resolved run config, as stored (typed on the keys qeval reads; `.as_dict()` for all)."""
        return self.results.config

    @property
    def setups(self) -> list[str]:
        return [s.name for s in self.results.setups]

    @property
    def tasks(self) -> list[str]:
        return list(self.results.tasks)

    @property
    def baseline(self) -> str:
        base = self.results.baseline
        if base is None:
            raise ValueError("this run has no baseline result")
        return base.name

    def summary(self) -> pd.DataFrame:
        """One row per setup x task: primary score, its stderr, the documents it is on (`n`: in a
        sequential run a stopped setup's are fewer than the baseline's), difference from the baseline,
        95% CI, p-values, flips, KL and top-1 agreement, and the gate verdict."""
        rows = []
        for s in self.results.setups:
            for task, info in self.results.tasks.items():
                cmp = s.vs_baseline.get(task)
                metric = cmp.metric if cmp else info.compared_metric
                value = s.tasks[task].metrics.get(metric) if task in s.tasks else None
                c: dict[str, Any] = cmp.model_dump() if cmp else {}
                ci = c.get("ci") or (None, None)
                rows.append(
                    {
                        "setup": s.name,
                        "task": task,
                        "status": s.status,
                        "metric": metric,
                        "score": value.value if value else None,
                        "stderr": value.stderr if value else None,
                        "n": s.tasks[task].n if task in s.tasks else None,
                        "delta": c.get("delta"),
                        "ci_low": ci[0],
                        "ci_high": ci[1],
                        "p_value": c.get("p_value"),
                        "p_adjusted": c.get("p_adjusted"),
                        "flips_to_wrong": c.get("flips_to_wrong"),
                        "flips_to_right": c.get("flips_to_right"),
                        "kl": c.get("kl"),
                        "top1_agreement": c.get("top1_agreement"),
                        "verdict": c.get("verdict"),
                        # the noise floor on the task (analysis/floor.py): an A/A control's figures
                        "floor_setup": (c.get("floor") or {}).get("setup"),
                        "floor_delta": (c.get("floor") or {}).get("delta"),
                        "floor_flips_to_wrong": (c.get("floor") or {}).get("flips_to_wrong"),
                        "floor_flips_to_right": (c.get("floor") or {}).get("flips_to_right"),
                        "floor_kl": (c.get("floor") or {}).get("kl"),
                        "within_floor": c.get("within_floor"),
                        "control": s.control,
                    }
                )
        return pd.DataFrame(rows)

    def kernels(self) -> pd.DataFrame:
        """One row per setup and module type: what the engine ran (docs/backends.md, "Kernel
        provenance"): the module's method / scheme / kernel or weight storage, its count, the
        attention backend, the KV cache, and any fallback the setup ran on."""
        rows = []
        for s in self.results.setups:
            p = s.quantization.provenance
            if p is None:
                continue
            for module, count in (p.linear or {"": 0}).items():
                rows.append(
                    {
                        "setup": s.name,
                        "module": module,
                        "count": count,
                        "attention": ", ".join(p.attention),
                        "kv_cache": p.kv_cache,
                        "kv_scales": p.kv_scales,
                        "fallbacks": "; ".join(p.fallbacks),
                        "source": p.source,
                    }
                )
        return pd.DataFrame(rows)

    def kl(self) -> pd.DataFrame:
        """One row per setup x perplexity task: the token-level KL(baseline || setup) and Δp
        distribution (llama.cpp's `--kl-divergence` figures); empty where none was measured."""
        rows = []
        for s in self.results.setups:
            for task, c in s.vs_baseline.items():
                if c.kl_distribution is not None:
                    rows.append({"setup": s.name, "task": task} | c.kl_distribution.model_dump())
        return pd.DataFrame(rows)

    def samples(self, setup: str | None = None, task: str | None = None) -> pd.DataFrame:
        """Per-sample records (prompt, target, prediction, correct, per-choice log-likelihoods,
        NLL, ...) for one or all setups and tasks, with `setup` and `task` columns."""
        frames = [
            self._samples(s, t) for s in ([setup] if setup else self.setups) for t in ([task] if task else self.tasks)
        ]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame(columns=["setup", "task", "sample_id", "target", "prediction", "correct"])
        return pd.concat(frames, ignore_index=True)

    def flips(self, setup: str, task: str) -> pd.DataFrame:
        """Samples whose correctness changed against the baseline, both directions, with the
        baseline's answer beside the setup's."""
        base = self._samples(self.baseline, task)[["sample_id", "prediction", "correct"]]
        other = self._samples(setup, task)
        both = other.merge(base, on="sample_id", suffixes=("", "_baseline"))
        both = both[both["correct"].notna() & (both["correct"] != both["correct_baseline"])].copy()
        both["direction"] = both["correct_baseline"].map({True: "right → wrong", False: "wrong → right"})
        cols = [
            "sample_id",
            "prompt",
            "target",
            "prediction_baseline",
            "prediction",
            "correct_baseline",
            "correct",
            "direction",
        ]
        return both[[c for c in cols if c in both.columns]].reset_index(drop=True)

    def performance(self) -> pd.DataFrame:
        """The performance phase: one row per setup x concurrency level x figure, with the
        median, range, repeats, unit and source (docs/performance.md); empty without one."""
        rows = []
        for s in self.results.setups:
            perf = s.performance
            for level in perf.levels if perf is not None else []:
                for name, fig in level:
                    if hasattr(fig, "median"):
                        rows.append(
                            {
                                "setup": s.name,
                                "concurrency": level.concurrency,
                                "figure": name,
                                "median": fig.median,
                                "min": fig.min,
                                "max": fig.max,
                                "repeats": fig.repeats,
                                "unit": fig.unit,
                                "source": fig.source,
                            }
                        )
        return pd.DataFrame(rows)

    def serving(self, table: str = "levels") -> pd.DataFrame:
        """`qeval goodput`'s figures (RUN_DIR/serving.json, docs/performance.md, "Serving the
        workload"): `levels`, one row per setup x engine setting x rate (goodput, throughput,
        latency percentiles in ms, KV usage, preemptions, queueing); `setups`, one row per setup
        (the tuned pick, its goodput, the `vllm serve` command, the recommendation's reason)."""
        from qeval.report.serving import level_rows, setup_rows
        from qeval.results.serving import read_serving

        if table not in ("levels", "setups"):
            raise ValueError(f"table {table!r}: levels or setups")
        results = read_serving(self.path)
        return pd.DataFrame(level_rows(results) if table == "levels" else setup_rows(results))

    def advice(self) -> pd.DataFrame:
        """The `advise:` block's sensitivity: one row per unit (a layer x module-type cell, or a
        block or type union) with the bytes keeping it adds, its cost and gain in KL, and whether
        the advised setup keeps it (docs/advisor.md); empty for a run without advice."""
        a = self.results.advice
        if a is None:
            return pd.DataFrame(columns=["unit", "layer", "kind", "extra_bytes", "cost_kl", "gain_kl", "kept"])
        kept = set(a.search.kept)
        return pd.DataFrame([u.model_dump() | {"kept": u.unit in kept} for u in a.units])

    def sequential(self) -> pd.DataFrame:
        """A sequential run's trajectories: one row per (setup, task) cell x look, the confidence
        sequence there (lower, upper), the verdict then, and the cell's stopping point and documents
        (docs/statistics.md, "Sequential gates"); empty for a run without the switch."""
        block = self.results.sequential
        cols = [
            "setup",
            "task",
            "look",
            "n",
            "lower",
            "upper",
            "verdict",
            "threshold",
            "stopped_at",
            "documents",
            "total",
        ]
        rows = [
            {
                "setup": c.setup,
                "task": c.task,
                "look": i,
                "n": k.n,
                "lower": k.ci[0],
                "upper": k.ci[1],
                "verdict": k.verdict,
                "threshold": c.threshold,
                "stopped_at": c.stopped_at,
                "documents": c.documents,
                "total": c.total,
            }
            for c in (block.cells if block else [])
            for i, k in enumerate(c.looks)
        ]
        return pd.DataFrame(rows, columns=cols)

    def generation_positions(self) -> pd.DataFrame:
        """Divergence along the generation: one row per setup x generation task x bucket of
        generated positions (KL, top-1 agreement, NLL and Δ NLL with its CI; docs/tasks.md,
        "Divergence along the generation"); empty for a run without `generation_divergence:`."""
        return self._generation_table(lambda t: t.positions)

    def multi_turn(self) -> pd.DataFrame:
        """The multi-turn probes: one row per setup x question turn (accuracy, Δ against the
        baseline with its CI, p-value and verdict, filler tokens, answer KL; docs/tasks.md,
        "Multi-turn probes"); empty for a run without them."""
        block = self.results.multi_turn
        setups = block.setups if block else {}
        return pd.DataFrame([{"setup": setup} | p.model_dump() for setup, points in setups.items() for p in points])

    def generation_lengths(self) -> pd.DataFrame:
        """Accuracy by the baseline's answer length: one row per setup x generation task x
        length bucket (accuracy, Δ against the baseline with its CI and p-value)."""
        return self._generation_table(lambda t: t.answer_lengths)

    def _generation_table(self, buckets: Callable[[TaskGeneration], Sequence[BaseModel]]) -> pd.DataFrame:
        """One row per setup x generation task x bucket of `buckets` (empty without the block)."""
        block = self.results.generation_divergence
        setups = block.setups if block else {}
        rows = [
            {"setup": setup, "task": task} | b.model_dump()
            for setup, tasks in setups.items()
            for task, t in tasks.items()
            for b in buckets(t)
        ]
        return pd.DataFrame(rows)

    def memory(self) -> pd.DataFrame:
        """The memory ledger: one row per setup x figure, predicted and measured, with sources."""
        rows = []
        for s in self.results.setups:
            mem = s.memory
            for figure in ("weights_bytes", "kv_bytes_per_token", "peak_bytes", "activations_bytes", "overhead_bytes"):
                value = getattr(mem, figure)
                if value is not None:
                    rows.append(
                        {
                            "setup": s.name,
                            "figure": figure,
                            "predicted": value.predicted,
                            "measured": value.measured,
                            "source": value.source,
                        }
                    )
            predicted = str(mem.capacity_source or "").startswith("predicted")
            conc = mem.max_concurrency
            rows.append(
                {
                    "setup": s.name,
                    "figure": "max_concurrency",
                    "predicted": conc if predicted else None,
                    "measured": None if predicted else conc,
                    "source": mem.capacity_source,
                }
            )
            if mem.engine:  # what the vLLM engine itself reported (on the CPU build: a host-memory pool)
                for key in ("kv_cache_tokens", "max_concurrency"):
                    rows.append(
                        {
                            "setup": s.name,
                            "figure": f"engine_{key}",
                            "predicted": None,
                            "measured": getattr(mem.engine, key),
                            "source": f"{mem.engine.source} (pool: {mem.engine.pool})",
                        }
                    )
        return pd.DataFrame(rows)

    def plot_quality_vs_memory(self) -> Any:
        """Figure: worst accuracy difference against memory per sequence, Pareto front dashed."""
        from qeval.report.plots import quality_vs_memory_figure, styled

        return styled(quality_vs_memory_figure)(self.results)

    def plot_task_deltas(self) -> Any:
        """Figure: each setup x task difference from the baseline with its 95% CI."""
        from qeval.report.plots import styled, task_deltas_figure

        return styled(task_deltas_figure)(self.results)

    @lru_cache(maxsize=256)  # noqa: B019 - a Run lives as long as the notebook looking at it
    def _samples(self, setup: str, task: str) -> pd.DataFrame:
        records = self._store.read_samples(setup, task)
        if not records:
            return pd.DataFrame()
        # the typed records, each as the fields its scorer set (a column per field, nested ones as
        # dicts); from_records, not read_json: no type guessing ("082" stays a string)
        df = pd.DataFrame.from_records([r.model_dump(exclude_unset=True) for r in records])
        df.insert(0, "task", task)
        df.insert(0, "setup", setup)
        return df

    def __repr__(self) -> str:
        return f"Run({self.path}, setups={self.setups}, tasks={self.tasks})"


def load_run(path: str | Path) -> Run:
    """Open a finished run directory (the folder holding results.json)."""
    root = Path(path)
    file = root / "results.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: is {root} a qeval run directory?")
    try:
        return Run(root, read_results(file))
    except UserError as exc:
        if "schema_version" in str(exc):
            raise SchemaVersionError(
                f"{exc} (rerun it with this qeval, or open it with the qeval that wrote it)"
            ) from None
        raise ValueError(str(exc)) from None
