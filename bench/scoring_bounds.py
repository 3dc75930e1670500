"""What bounds qeval's multiple-choice scoring short of the matmul-peak floor, measured in one run.

    .venv/bin/python bench/scoring_bounds.py [--model models/smollm2-135m] [--include tasks/lm_eval_full]
                                             [--tasks hellaswag_full] [--limit 200] [--batch-sizes 16,64]
                                             [--threads 2] [--json OUT]

The floor is the one `bench/compare_lm_eval.py --flops` states: unique tokens (each document's
context once plus every continuation) x 2 x parameters, at the float32 peak of a 1024^3 matmul
on the same threads. qeval's wall time for a task (its lm-eval route, hf backend, float32) is split
by hooks on the model's forward into:

- **session**: lm-eval building the task's documents and requests (before the first forward);
- **forward**: inside the model's forward passes. Its tokens are counted as run (padded rows x
  widths) and as real (the attention mask's new columns), so that `padding` = run / real - 1;
- **other**: everything else in the scoring call, Python work around the passes (encoding,
  grouping, top-k, records).

Printed per task and batch size: each share of the wall time, the padding overhead, the tokens
run beyond the unique ones (a continuation's second pass re-reads nothing, but its first token
comes from the context's last position, so real tokens can be fewer than unique ones), and the
forward passes' own rate against the matmul peak: the model's shapes (hidden 576 for SmolLM2,
attention, the 49,152-way vocabulary softmax at the scored positions) run below the 1024^3 peak
even with no padding and no Python at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from compare_lm_eval import SHOTS, matmul_peak, qeval_backend  # noqa: E402  (a sibling script)


class ForwardMeter:
    """Time inside the model's forward passes and the tokens they ran (padded and real)."""

    def __init__(self, model: Any) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.run_tokens = 0
        self.real_tokens = 0
        self.first_call: float | None = None
        self._t0 = 0.0
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if ids is not None:
            rows, width = ids.shape
            self.run_tokens += rows * width
            # the mask covers past + new tokens: its last `width` columns are this pass's own
            self.real_tokens += int(mask[:, -width:].sum()) if mask is not None else rows * width
        self._t0 = time.perf_counter()
        if self.first_call is None:
            self.first_call = self._t0

    def _post(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def measure(backend: Any, task: str, args: argparse.Namespace, peak: float, params: int) -> dict[str, Any]:
    from qeval.config.lm_eval import LmEvalSpec, LmEvalTask
    from qeval.tasks.lm_eval.scoring import score_lm_eval
    from qeval.tasks.lm_eval.session import open_session

    meter = ForwardMeter(backend.model)
    t0 = time.perf_counter()
    spec = LmEvalSpec(
        include_path=[str(args.include)],
        fewshot_seed=1234,
        tasks=[LmEvalTask(name=task, num_fewshot=SHOTS.get(task, 0))],
    )
    session = open_session(spec, ROOT, args.limit)
    try:
        result = score_lm_eval(backend, session, [task], lambda n: None)[task]
    finally:
        session.close()
        meter.close()
    wall = time.perf_counter() - t0
    session_s = (meter.first_call or t0) - t0
    unique = sum(
        len(backend.conv.encode(str(r.prompt))) + (sum(r.n_tokens) if isinstance(r.n_tokens, list) else r.n_tokens or 0)
        for r in result.records
    )
    floor = unique * 2 * params / peak
    return {
        "task": task,
        "batch_size": backend.batch_size,
        "n": len(result.records),
        "wall_s": wall,
        "session_s": session_s,
        "forward_s": meter.seconds,
        "other_s": wall - session_s - meter.seconds,
        "forward_calls": meter.calls,
        "unique_tokens": unique,
        "real_tokens": meter.real_tokens,
        "run_tokens": meter.run_tokens,
        "padding": meter.run_tokens / max(meter.real_tokens, 1) - 1,
        "floor_s": floor,
        "floor_share": floor / wall,
        # the passes' own rate on the tokens they really ran, padded ones included
        "forward_peak_share": meter.run_tokens * 2 * params / peak / meter.seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m")
    ap.add_argument("--include", type=Path, default=ROOT / "tasks" / "lm_eval_full")
    ap.add_argument("--tasks", default="hellaswag_full,arc_easy_full")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--batch-sizes", default="16,64")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    args.backend, args.dtype, args.max_length = "hf", "float32", 1024
    peak = matmul_peak(args.threads)
    rows = []
    for bs in (int(b) for b in args.batch_sizes.split(",")):
        args.batch_size = bs
        backend = qeval_backend(args)
        params = sum(p.numel() for p in backend.model.parameters())
        for task in args.tasks.split(","):
            measure(backend, task, argparse.Namespace(**{**vars(args), "limit": 8}), peak, params)  # warm-up
            row = measure(backend, task, args, peak, params)
            rows.append(row)
            w = row["wall_s"]
            print(
                f"{task:<16} batch {bs:<3} n={row['n']:<5} wall {w:6.1f} s: session {row['session_s'] / w:4.0%}, "
                f"forward {row['forward_s'] / w:4.0%}, other {row['other_s'] / w:4.0%} | padding "
                f"+{row['padding']:.0%} | tokens run / unique {row['run_tokens'] / row['unique_tokens']:.2f} | "
                f"floor share {row['floor_share']:.0%}, forward passes at {row['forward_peak_share']:.0%} "
                f"of the peak",
                flush=True,
            )
        backend.close()
    print(
        f"float32 matmul peak {peak / 1e9:.1f} GFLOP/s (1024^3, {args.threads} thread(s)), "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps({"peak_flops": peak, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
