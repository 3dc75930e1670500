"""Sequential against fixed verdicts, replayed on a run's stored per-document scores (issue 42).

    .venv/bin/python bench/sequential_replay.py RUN_DIR [--baseline baseline] [--metric acc]
        [--gates 0.02,0.03,0.05,0.10] [--chunk 50] [--min-docs 50] [--alpha 0.025] [--json OUT]

For every (setup, task) that RUN_DIR stores for both the baseline and the setup, the paired
per-document values (the setup's records in the order it scored them: a sequential run's seeded
order, chunk by chunk) are replayed at each `max_drop` gate of `--gates`:

- **sequential**: the betting confidence sequence (qeval/analysis/sequential.py `trajectory`,
  the same code a run uses) looked at after every `--chunk` documents at level `--alpha` per
  cell, no verdict before `--min-docs`: its verdict and the documents it stopped at;
- **fixed**: Newcombe's paired 95% interval (qeval/analysis/stats.py `paired_accuracy`) once, on
  every paired document stored: the verdict a fixed run on those documents gives.

The replay decides nothing a run did not score: a setup that stopped early has only its prefix,
so its fixed verdict is on that prefix. Nothing is timed; it runs in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from qeval.analysis.sequential import gate_score, trajectory
from qeval.analysis.stats import paired_accuracy, verdict
from qeval.records.store import read_sample_file
from qeval.results.samples import SampleRecord


def _records(path: Path) -> list[SampleRecord]:
    return read_sample_file(path)


def replay(
    base: list[SampleRecord],
    other: list[SampleRecord],
    metric: str,
    gate: float,
    chunk: int,
    min_docs: int,
    alpha: float,
) -> dict[str, Any]:
    """One cell at one gate: the sequential verdict and stopping point against the fixed one."""
    by_id = {r.sample_id: r for r in base}
    pairs = [
        ((by_id[r.sample_id].metrics or {})[metric], (r.metrics or {})[metric]) for r in other if r.sample_id in by_id
    ]
    b = np.array([p[0] for p in pairs], dtype=float)
    o = np.array([p[1] for p in pairs], dtype=float)
    looks = list(range(chunk, len(b) + 1, chunk)) + ([len(b)] if len(b) % chunk else [])
    traj = trajectory(gate_score(b, o, True, gate, False, None), looks, alpha, min_docs)
    fixed = paired_accuracy(b, o, metric, 0)
    last = traj.looks[-1] if traj.looks else None
    return {
        "n": len(b),
        "gate": gate,
        "delta": float(o.mean() - b.mean()) if len(b) else None,
        "sequential": traj.verdict,
        "stopped_at_n": last.n if traj.stopped_at is not None and last else None,
        "sequence": (last.lower, last.upper) if last else None,
        "fixed": verdict(fixed.ci, True, gate),
        "fixed_ci": fixed.ci,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--baseline", default="baseline")
    ap.add_argument("--metric", default="acc")
    ap.add_argument("--gates", default="0.02,0.03,0.05,0.10")
    ap.add_argument("--chunk", type=int, default=50)
    ap.add_argument("--min-docs", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=0.025)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    samples = args.run / "samples"
    base_dir = samples / args.baseline
    rows = []
    for setup in sorted(p for p in samples.iterdir() if p.is_dir() and p.name != args.baseline):
        for path in sorted(setup.glob("*.jsonl")):
            base_path = base_dir / path.name
            if not base_path.is_file():
                continue
            base, other = _records(base_path), _records(path)
            for gate in (float(g) for g in args.gates.split(",")):
                row = replay(base, other, args.metric, gate, args.chunk, args.min_docs, args.alpha)
                rows.append({"setup": setup.name, "task": path.stem} | row)
    print("| setup | task | gate | paired docs | Δ | sequential | stopped at | sequence | fixed-n on all | Newcombe |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- | --- |")
    for r in rows:
        seq = "—" if r["sequence"] is None else f"[{r['sequence'][0]:+.3f}, {r['sequence'][1]:+.3f}]"
        fixed = f"[{r['fixed_ci'][0]:+.3f}, {r['fixed_ci'][1]:+.3f}]"
        print(
            f"| {r['setup']} | {r['task']} | {r['gate']:.2f} | {r['n']} | {r['delta']:+.3f} | {r['sequential']} | "
            f"{r['stopped_at_n'] or '—'} | {seq} | {r['fixed']} | {fixed} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
