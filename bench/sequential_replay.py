"""Sequential against fixed verdicts, replayed on a run's stored per-document scores (issue 42).

    .venv/bin/python bench/sequential_replay.py RUN_DIR [--baseline baseline] [--metric acc]
        [--gates 0.02,0.03,0.05,0.10] [--chunk 50] [--min-docs 50] [--alpha 0.025] [--json OUT]
        [--order-seed SEED]

For every (setup, task) that RUN_DIR stores for both the baseline and the setup, the paired
per-document values (the setup's records in the order it scored them: a sequential run's seeded
order, chunk by chunk) are replayed at each `max_drop` gate of `--gates`:

- **sequential**: the betting confidence sequence (qeval/analysis/sequential.py `trajectory`,
  the same code a run uses) looked at after every `--chunk` documents at level `--alpha` per
  cell, no verdict before `--min-docs`: its verdict and the documents it stopped at;
- **fixed**: Newcombe's paired 95% interval (qeval/analysis/stats.py `paired_accuracy`) once, on
  every paired document stored: the verdict a fixed run on those documents gives.

With `--order-seed`, a fixed run's records (stored in each set's own order) are first put in the
seeded random order a sequential run with that seed scores (qeval/analysis/sequential_run.py
`seeded_order`): on a fixed run of a whole set, the replay is the sequential run on that set,
looks, stops and documents included, and the fixed verdict is the full set's.

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
from qeval.analysis.sequential_run import seeded_order
from qeval.analysis.stats import paired_accuracy, verdict
from qeval.records.store import read_sample_file
from qeval.results.samples import SampleRecord


def _records(path: Path, task: str, seed: int | None) -> list[SampleRecord]:
    """The stored records, in the seeded order when `seed` is given (sample ids are the documents'
    indices in the set, as lm-eval numbers them)."""
    records = read_sample_file(path)
    if seed is None:
        return records
    n_docs = max(int(r.sample_id) for r in records) + 1
    rank = {str(d): i for i, d in enumerate(seeded_order(seed, task, n_docs))}
    return sorted(records, key=lambda r: rank[r.sample_id])


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
    # the triage signal (issue 42, "Triage"): the setup's KL to the baseline over its first chunk,
    # nats a token, where the run scored it against the baseline's top-k
    first = [r for r in other[:chunk] if r.kl is not None and r.kl_tokens]
    kl_first = sum(r.kl or 0.0 for r in first) / sum(r.kl_tokens or 0 for r in first) if first else None
    last = traj.looks[-1] if traj.looks else None
    return {
        "n": len(b),
        "scored": last.n if traj.stopped_at is not None and last else len(b),
        "gate": gate,
        "delta": float(o.mean() - b.mean()) if len(b) else None,
        "sequential": traj.verdict,
        "stopped_at_n": last.n if traj.stopped_at is not None and last else None,
        "sequence": (last.lower, last.upper) if last else None,
        "fixed": verdict(fixed.ci, True, gate),
        "fixed_ci": fixed.ci,
        "kl_first_chunk": kl_first,
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
    ap.add_argument("--order-seed", type=int, default=None, help="replay in a sequential run's seeded order")
    args = ap.parse_args(argv)
    samples = args.run / "samples"
    base_dir = samples / args.baseline
    rows = []
    for setup in sorted(p for p in samples.iterdir() if p.is_dir() and p.name != args.baseline):
        for path in sorted(setup.glob("*.jsonl")):
            base_path = base_dir / path.name
            if not base_path.is_file():
                continue
            base = _records(base_path, path.stem, args.order_seed)
            other = _records(path, path.stem, args.order_seed)
            for gate in (float(g) for g in args.gates.split(",")):
                row = replay(base, other, args.metric, gate, args.chunk, args.min_docs, args.alpha)
                rows.append({"setup": setup.name, "task": path.stem} | row)
    print(
        "| setup | task | gate | paired docs | Δ | sequential | stopped at | sequence | fixed-n on all | Newcombe "
        "| KL, first chunk |"
    )
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- | --- | ---: |")
    for r in rows:
        seq = "—" if r["sequence"] is None else f"[{r['sequence'][0]:+.3f}, {r['sequence'][1]:+.3f}]"
        fixed = f"[{r['fixed_ci'][0]:+.3f}, {r['fixed_ci'][1]:+.3f}]"
        print(
            f"| {r['setup']} | {r['task']} | {r['gate']:.2f} | {r['n']} | {r['delta']:+.3f} | {r['sequential']} | "
            f"{r['stopped_at_n'] or '—'} | {seq} | {r['fixed']} | {fixed} | "
            f"{'—' if r['kl_first_chunk'] is None else format(r['kl_first_chunk'], '.4f')} |"
        )
    for gate in sorted({r["gate"] for r in rows}):
        at = [r for r in rows if r["gate"] == gate]
        scored, total = sum(r["scored"] for r in at), sum(r["n"] for r in at)
        agree = sum(r["sequential"] == r["fixed"] for r in at if r["fixed"] != "inconclusive")
        decided = sum(r["fixed"] != "inconclusive" for r in at)
        contra = sum(r["sequential"] not in ("inconclusive", r["fixed"]) for r in at)
        print(
            f"gate {gate:.2f}: {scored:,} of {total:,} paired documents scored ({scored / max(total, 1):.0%}); "
            f"the same verdict in {agree} of the {decided} cells the fixed interval decides; {contra} contradicted"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
