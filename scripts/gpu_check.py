"""The prepared GPU check: configs/gpu-check.yaml on one GPU, within 10 minutes.

    python scripts/gpu_check.py                      # CUDA, SmolLM2-135M, 200 samples a task
    python scripts/gpu_check.py --device cpu --quick  # the same setups on CPU, small (tests/e2e)

The transformers backend serves 16-bit, INT8 and INT4 weights (optimum-quanto), bitsandbytes
NF4 (skipped where bitsandbytes is missing, and on CPU), an INT4 KV cache and an FP8 KV
cache; each setup is scored, its memory measured and its performance timed (docs/
performance.md), and qeval writes report.md and report.html. The script prints the wall
time, the report's path and its Performance section, and fails (exit 1) past --time-limit.

It needs nothing from a network: the model folder (`make smollm2`, or --model DIR) and
qeval's environment (.venv, or the interpreter that runs this script).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
QUICK = {"input_len": 32, "output_len": 8, "num_requests": 2, "max_concurrency": 4, "repeats": 2, "warmup": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "gpu-check.yaml")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model", type=Path, help="model folder (default: the config's, models/smollm2-135m)")
    ap.add_argument("--limit", type=int, help="samples per task (default: the config's; --quick: 8)")
    ap.add_argument("--output", type=Path, default=ROOT / "reports" / "gpu-check")
    ap.add_argument("--quick", action="store_true", help="a small workload: a smoke test of the path, not figures")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds; exit 1 past it")
    args = ap.parse_args()

    if args.device == "cuda" and shutil.which("nvidia-smi") is None:
        sys.exit("gpu_check: --device cuda but no nvidia-smi on this machine (use --device cpu for the CPU check)")
    cfg = yaml.safe_load(args.config.read_text())
    cfg["device"] = args.device
    if args.device == "cpu":  # the GPU's 16-bit dtype where this CPU runs it natively, else float32 (not emulated)
        cfg["model"]["dtype"] = "auto"
    cfg["model"]["path"] = str((args.model or ROOT / cfg["model"]["path"]).resolve())
    cfg["tasks_dir"] = str(ROOT / cfg.get("tasks_dir", "tasks"))
    if not Path(cfg["model"]["path"], "config.json").is_file():
        sys.exit(f"gpu_check: no model at {cfg['model']['path']} (run `make smollm2`, or pass --model DIR)")
    if args.quick:
        cfg["performance"] |= QUICK
        cfg["limit"] = 8
    if args.limit:
        cfg["limit"] = args.limit
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpu-check.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        t0 = time.time()
        try:
            proc = subprocess.run(
                [python, "-m", "qeval.cli", "run", str(path), "--output", str(args.output), "--force"],
                cwd=ROOT,
                env=os.environ | {"HF_HUB_OFFLINE": "1"},
                timeout=args.time_limit,
                check=False,
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    wall = time.time() - t0
    report = args.output / "report.md"
    if report.is_file():
        text = report.read_text()
        start = text.find("## Performance")
        if start >= 0:
            end = text.find("\n## ", start + 1)
            print(text[start : end if end >= 0 else None])
    print(
        f"gpu_check: {args.device}, {wall:.0f} s (limit {args.time_limit:.0f} s), qeval exit code {code}; "
        f"report: {report}"
    )
    if code is None or wall > args.time_limit:
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()
