"""qeval goodput's figures against `vllm bench serve`'s own summary, on the same requests, and
the tuner's pick against an exhaustive sweep of the same levels.

    .venv/bin/qeval goodput configs/smollm2-goodput.yaml --exhaustive     # every level measured
    .venv/bin/python bench/goodput_vs_vllm_bench.py reports/smollm2-goodput [--json OUT]

1. Per level: qeval's goodput, throughput and TTFT / TPOT / ITL / E2E p50, p90, p99 (its own
   SLO maths, qeval/perf/slo.py, on the bench's per-request lists) against the figures the bench
   printed and saved for the same run (request_goodput with the same --goodput targets,
   request_throughput, pNN_ttft_ms ...). Agreement: within 5%, or both under 1 ms apart.
2. Per setup: the tuner (qeval/perf/tune.py, early stop) replayed on the exhaustive sweep's
   measurements against the best admissible level of the whole sweep, and the levels and engine
   starts each needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qeval.perf.tune import best, replay, search, settings_of  # noqa: E402
from qeval.results.serving import ServingResults, read_serving  # noqa: E402

FIGURES = [("goodput_rps", "request_goodput", None), ("throughput_rps", "request_throughput", None)] + [
    (f"{name}.{p}", f"{p}_{bench}_ms", (name, p))
    for name, bench in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el"))
    for p in ("p50", "p90", "p99")
]


def agreement(results: ServingResults, run_dir: Path) -> list[dict[str, Any]]:
    """One row per setup, level and figure: qeval's value, the bench's, the ratio, the verdict."""
    rows = []
    for s in results.setups:
        for lv in s.levels:
            saved = json.loads(
                (run_dir / "serving" / s.setup / f"bench-mns{lv.max_num_seqs}-rate{lv.rate:g}.json").read_text()
            )
            for name, key, pct in FIGURES:
                ours = lv.percentiles_ms[pct[0]][pct[1]] if pct else getattr(lv, name)
                theirs = float(saved[key] or 0.0)
                ratio = ours / theirs if theirs else (1.0 if ours == 0 else float("inf"))
                close = abs(ratio - 1) <= 0.05 or (pct is not None and abs(ours - theirs) < 1.0)
                rows.append(
                    {
                        "setup": s.setup,
                        "max_num_seqs": lv.max_num_seqs,
                        "rate": lv.rate,
                        "figure": name,
                        "qeval": ours,
                        "vllm_bench_serve": theirs,
                        "ratio": ratio,
                        "verdict": "agree" if close else "disagree",
                    }
                )
    return rows


def tuner_vs_exhaustive(results: ServingResults) -> list[dict[str, Any]]:
    """Per setup: the tuner's pick on the sweep's measurements against the sweep's best."""
    out = []
    for s in results.setups:
        if not s.levels:
            continue
        table = {(lv.max_num_seqs, lv.rate): lv for lv in s.levels}
        rates = sorted({lv.rate for lv in s.levels})
        seqs = sorted({lv.max_num_seqs for lv in s.levels})
        if len(table) != len(rates) * len(seqs):
            out.append({"setup": s.setup, "note": "not an exhaustive sweep: rerun with --exhaustive"})
            continue
        full = [(settings_of([m], [None])[0], r, table[(m, r)]) for m in seqs for r in rates]
        whole = best(full, results.kv_usage_limit)
        tuned = search(settings_of(seqs, [None]), rates, replay(table), results.kv_usage_limit)

        def named(levels: list[Any], i: int | None) -> str:
            return (
                "none"
                if i is None
                else f"max-num-seqs {levels[i][0].max_num_seqs} @ {levels[i][1]:g}/s ({levels[i][2].goodput_rps:.3f}/s)"
            )

        out.append(
            {
                "setup": s.setup,
                "exhaustive_pick": named(full, whole),
                "tuner_pick": named(tuned.levels, tuned.pick),
                "same": named(full, whole) == named(tuned.levels, tuned.pick),
                "exhaustive_levels": len(full),
                "tuner_levels": len(tuned.levels),
                "engine_starts": tuned.restarts,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = read_serving(args.run_dir)
    rows = agreement(results, args.run_dir)
    tuner = tuner_vs_exhaustive(results)
    print(f"{results.config}: {results.load_generator}; {results.machine}")
    print(f"{'setup':<8} {'mns':>4} {'rate':>5} {'figure':<15} {'vllm bench serve':>17} {'qeval':>12} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['setup']:<8} {r['max_num_seqs']:>4} {r['rate']:>5g} {r['figure']:<15} "
            f"{r['vllm_bench_serve']:>17.4g} {r['qeval']:>12.4g} {r['ratio']:>7.3f}  {r['verdict']}"
        )
    bad = sum(r["verdict"] != "agree" for r in rows)
    print(f"{len(rows) - bad} of {len(rows)} figures agree within 5%")
    for t in tuner:
        print(json.dumps(t))
    if args.json:
        args.json.write_text(json.dumps({"agreement": rows, "tuner": tuner}, indent=1))


if __name__ == "__main__":
    main()
