"""The prepared GPU run: the seed's memory story, the performance phase and the tiny model's
scores measured on one accelerator in one call, everything small written into one folder.

    make gpu-bundle                                                   # here: build/gpu-bundle/
    python3 scripts/gpu_run.py --bundle build/gpu-bundle --out $OUT   # there (the device tool,
                                                                      #   carry ["build/gpu-bundle"])
    .venv/bin/python scripts/gpu_run.py --device cpu --shape small --out DIR   # the same path on CPU

On the GPU machine the image lacks pydantic and optimum-quanto: `--bundle` installs the wheels
`make gpu-bundle` wrote (pip, no index, into a temporary folder) and runs this script again with
that folder and the working tree first on PYTHONPATH; qeval itself runs from the working tree.

What it measures (README, "What ran on a GPU"; scripts/gpu_memory.py says how):
1. the tiny shipped model (models/qeval-tiny) scored by `qeval run` on the device and on the
   machine's CPU, same dtype, same samples: the scores side by side;
2. the device's ceilings (qeval/perf/ceilings.py: copy bandwidth, matmul peaks);
3. a 7B-class architecture (default tests/data/llama3-8b-config.json) with random weights on the
   device, at 16-bit, INT8 and INT4 weights (optimum-quanto) and with a 16-bit and an INT4 KV
   cache, at 2,048 and 4,096 tokens: weights, KV, activation peaks and runtime overhead measured
   beside qeval's predictions, and the concurrency the formula allows beside what fit;
4. the performance phase (qeval/backends/hf/perf.py) per weight precision, with its share of the
   ceilings (qeval/perf/block.py).
Quality on random weights means nothing; memory and speed do not depend on the values.

It stops starting work past --time-budget (default 480 s: 8 minutes), records what it skipped,
and writes OUT/gpu-run.json and OUT/gpu-run.md after each phase (atomically), so a call cut off
still returns what was measured. Exit 0 when every phase ran, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

SCHEMA = "qeval-gpu-run/1"
#: set in the environment of the run that follows the bundle's installation
SITE_ENV = "QEVAL_GPU_RUN_SITE"
TINY_TASKS = ["compare_mc", "addition", "facts", "ppl"]
TINY_SETUPS: dict[str, dict[str, Any]] = {
    "bf16": {"baseline": True},
    "int8": {"weights": "int8"},
    "int4": {"weights": "int4", "group_size": 128},
    "kv-int4": {"kv_cache": "int4"},
}
#: the shapes of the run: full on the GPU, small for the CPU test of the same path
SHAPES: dict[str, dict[str, Any]] = {
    "full": {
        "contexts": [2048, 4096],
        "max_batch": 4096,
        "cpu_capacity_mib": None,
        "cell_s": 45.0,
        "perf": {"input_len": 256, "output_len": 64, "max_concurrency": 32, "repeats": 2, "warmup": 1},
        "ceilings_s": 10.0,
        "tiny_limit": 100,
        "tiny_setups": list(TINY_SETUPS),
    },
    "small": {
        "contexts": [128, 256],
        "max_batch": 96,
        "cpu_capacity_mib": 26,
        "cell_s": 3.0,
        "perf": {"input_len": 32, "output_len": 4, "max_concurrency": 4, "repeats": 1, "warmup": 1},
        "ceilings_s": 1.0,
        "tiny_limit": 4,
        "tiny_setups": ["bf16"],
    },
}


def seconds(text: str) -> float:
    """A time budget: a finite number of seconds, 0 or more (0: every phase skipped, the files
    written). nan turned the deadline off, as no comparison with it is true, and went into the
    JSON as NaN; inf the same; a negative one is a typo."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r:.40}: give a finite number of seconds, 0 or more")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu-run.json and gpu-run.md ($OUT)")
    ap.add_argument("--bundle", type=Path, help="folder of wheels to install first (make gpu-bundle)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--shape",
        choices=list(SHAPES),
        default="full",
        help="full: the architecture as published; small: cut to a CPU test's size (same path)",
    )
    ap.add_argument("--model-config", type=Path, default=ROOT / "tests" / "data" / "llama3-8b-config.json")
    ap.add_argument(
        "--weights", default="16,int8,int4", help="weight precisions, of 16 (the model's dtype), int8, int4"
    )
    ap.add_argument("--kv", default="auto,int4", help="KV caches, of auto (16-bit), int4, int2, fp8")
    ap.add_argument("--contexts", help="comma-separated context lengths (default: the shape's)")
    ap.add_argument("--time-budget", type=seconds, default=480.0, help="seconds; no phase starts past it")
    ap.add_argument("--tiny-limit", type=int, help="samples per task for the tiny model (default: the shape's)")
    ap.add_argument("--tiny-setups", help="comma-separated, of " + ",".join(TINY_SETUPS))
    ap.add_argument(
        "--tiny-dtype",
        choices=["bfloat16", "float16", "float32"],
        help="the tiny model's dtype on both devices (default: bfloat16 on cuda, float32 on cpu)",
    )
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: tiny, ceilings, memory, perf")
    args = ap.parse_args(argv)
    bad = [w for w in args.weights.split(",") if w not in ("16", "int8", "int4")]
    bad += [k for k in args.kv.split(",") if k not in ("auto", "int4", "int2", "fp8")]
    bad += [p for p in args.skip.split(",") if p and p not in ("tiny", "ceilings", "memory", "perf")]
    if args.tiny_setups:
        bad += [s for s in args.tiny_setups.split(",") if s not in TINY_SETUPS]
    if bad:
        ap.error(f"unknown value(s): {', '.join(bad)}")
    if not args.model_config.is_file():
        ap.error(f"--model-config {args.model_config}: no such file")
    if args.bundle is not None and not sorted(args.bundle.glob("*.whl")):
        ap.error(f"--bundle {args.bundle}: no wheels there (run `make gpu-bundle` and carry build/gpu-bundle)")
    return args


def install_bundle(bundle: Path, argv: list[str]) -> None:
    """pip-install the bundle's wheels into a fresh temporary folder (no index, no dependencies:
    the bundle names each), then replace this process with a run that has that folder and the
    working tree first on PYTHONPATH (the `qeval run` workers inherit it)."""
    site = Path(tempfile.mkdtemp(prefix="qeval-gpu-site-"))
    wheels = sorted(str(w) for w in bundle.glob("*.whl"))
    t0 = time.time()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--target",
            str(site),
            *wheels,
        ],
        check=True,
    )
    print(f"gpu_run: installed {len(wheels)} wheels from {bundle} into {site} in {time.time() - t0:.0f} s", flush=True)
    path = os.pathsep.join([str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = os.environ | {"PYTHONPATH": path, SITE_ENV: str(site)}
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


class Run:
    """The run's record, saved (JSON and markdown, atomically) after every phase."""

    def __init__(self, args: argparse.Namespace, shape: dict[str, Any]) -> None:
        self.args, self.shape = args, shape
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.time_budget
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "device": args.device,
            "shape": args.shape,
            "time_budget_s": args.time_budget,
            "phases": {},
            "skipped": [],
            "errors": [],
            "note": "The 7B-class model has random weights: its memory and speed are real, what it would score is "
            "not (none is scored). Quality is measured on the shipped tiny model alone.",
        }

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def phase(self, name: str, fn: Callable[[], Any], needs_s: float = 0.0) -> Any:
        """Run one phase, timed; a failure is recorded (and the run goes on), as is a skip."""
        if name in self.args.skip.split(","):
            self.data["skipped"].append(f"{name}: --skip")
            return None
        if self.left() < needs_s:
            self.data["skipped"].append(f"{name}: {max(self.left(), 0):.0f} s of the time budget left")
            self.save()
            return None
        t0 = time.monotonic()
        print(f"gpu_run: {name} ({self.left():.0f} s of the budget left)", flush=True)
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - one phase's failure is recorded; the others still run
            self.data["errors"].append(
                {
                    "phase": name,
                    "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                    "traceback": traceback.format_exc(limit=10),
                }
            )
            result = None
        self.data["phases"][name] = round(time.monotonic() - t0, 1)
        self.save()
        return result

    def save(self) -> None:
        from gpu_report import markdown

        from qeval.files.atomic import atomic_write_bytes, atomic_write_json

        self.data["seconds"] = round(time.monotonic() - self.t0, 1)
        atomic_write_json(self.args.out / "gpu-run.json", self.data)
        atomic_write_bytes(self.args.out / "gpu-run.md", markdown(self.data).encode())


# --- the phases ---------------------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    """Versions and the device, as this process sees them."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "libraries": {d: v(d) for d in ("transformers", "optimum-quanto", "pydantic", "numpy", "accelerate")},
        "bundle_site": os.environ.get(SITE_ENV),
        "threads": torch.get_num_threads(),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset: torch's default)"),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env |= {
            "device_name": props.name,
            "total_memory": int(props.total_memory),
            "multiprocessors": props.multi_processor_count,
            "capability": list(torch.cuda.get_device_capability()),
        }
    return env


def tiny_config(device: str, dtype: str, setups: list[str], limit: int) -> dict[str, Any]:
    """configs/demo.yaml's setups and tasks on the tiny model, on `device` in `dtype`, no performance."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg |= {
        "name": f"gpu-run-tiny-{device}",
        "device": device,
        "limit": limit,
        "tasks": TINY_TASKS,
        "tasks_dir": str(ROOT / "tasks"),
        "setups": [{"name": s, **TINY_SETUPS[s]} for s in setups],
    }
    cfg["model"] |= {"path": str(ROOT / "models" / "qeval-tiny"), "dtype": dtype}
    cfg.pop("performance", None)
    return cfg


def cpu_threads() -> int:
    """Threads of the tiny model's CPU run: a quarter of the cores, the rest left to the device's work."""
    return max(1, (os.cpu_count() or 2) // 4)


def start_tiny(
    role: str, device: str, dtype: str, setups: list[str], limit: int, work: Path
) -> tuple[subprocess.Popen[str], Path]:
    """`qeval run` of tiny_config in its own process (its workers inherit PYTHONPATH); `role`
    (device, cpu) names its files: on the CPU test both runs are on the CPU."""
    import yaml

    cfg_path = work / f"tiny-{role}.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_config(device, dtype, setups, limit), sort_keys=False))
    out = work / f"tiny-{role}"
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(
            [p for p in [os.environ.get(SITE_ENV), str(ROOT), os.environ.get("PYTHONPATH")] if p]
        ),
    }
    if role == "cpu":  # beside the device's run: leave it cores
        env |= {"OMP_NUM_THREADS": str(cpu_threads())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", "run", str(cfg_path), "--output", str(out), "--force", "--no-performance"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, out


def finish_tiny(proc: subprocess.Popen[str], out: Path, timeout: float) -> dict[str, Any]:
    """Wait for a tiny run (killed past `timeout`); its scores per setup, task and metric."""
    try:
        log, _ = proc.communicate(timeout=max(timeout, 1.0))
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
        code = None
    res: dict[str, Any] = {"exit_code": code, "log_tail": (log or "")[-1500:]}
    path = out / "results.json"
    if path.is_file():
        r = json.loads(path.read_text())
        res["setups"] = {
            s["name"]: {
                "status": s["status"],
                "error": s.get("error"),
                "scores": {
                    t: {m: v["value"] for m, v in block["metrics"].items()}
                    for t, block in (s.get("tasks") or {}).items()
                },
            }
            for s in r["setups"]
        }
        res["samples_per_task"] = {
            t: info.get("n") for t, info in (r.get("tasks") or {}).items() if isinstance(info, dict)
        }
    return res


def compare_scores(device: dict[str, Any], cpu: dict[str, Any]) -> list[dict[str, Any]]:
    """Each (setup, task, metric) scored on both: the two values and their difference."""
    rows = []
    for name, d in (device.get("setups") or {}).items():
        c = (cpu.get("setups") or {}).get(name) or {}
        for task, metrics in d["scores"].items():
            for metric, value in metrics.items():
                other = (c.get("scores") or {}).get(task, {}).get(metric)
                rows.append(
                    {
                        "setup": name,
                        "task": task,
                        "metric": metric,
                        "device": value,
                        "cpu": other,
                        "diff": None if other is None or value is None else value - other,
                    }
                )
    return rows


def ceilings(device: str, dtype: str, budget_s: float) -> dict[str, Any]:
    from qeval.perf.ceilings import probe

    return probe(device, dtype, budget_s)


class NoTokenizer:
    """The performance workload's prompts are random ids; a model built from config.json has no
    tokenizer, and adds no special tokens of its own."""

    all_special_ids: list[int] = []

    def __call__(self, text: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[])


def performance(
    model: Any,
    setup: Any,
    shape: Any,
    dtype: str,
    device: str,
    capacity: int,
    weights_bytes: int,
    kv_per_token: int,
    ceilings_probe: dict[str, Any] | None,
    spec_fields: dict[str, Any],
    budget_context: int,
    fit: int | None,
) -> dict[str, Any]:
    """qeval's performance phase on the loaded model: levels 1 and `max`, timed by the hf backend's
    measurement and summarised, with its shares of the ceilings, as a run stores them. `max` is the
    batch the memory search found to fit at `budget_context` where there is one (else the formula's
    concurrency at qeval's default budget on this device), capped at the spec's max_concurrency."""
    from qeval.backends.hf import kv_cache
    from qeval.backends.hf import perf as perf_hf
    from qeval.backends.hf.kv_rule import HeldKv
    from qeval.backends.workload import resolve_levels, workload_for
    from qeval.config.performance import PerfSpec
    from qeval.memory.capacity import GIB, Budget
    from qeval.memory.figures import memory_block
    from qeval.perf.block import performance_block
    from qeval.perf.phase import summarize
    from qeval.records.job import MemoryFigure, PhaseRecord
    from qeval.results.performance import Ceilings

    measured = {
        "weights_bytes": MemoryFigure(weights_bytes, "gpu_memory: loaded tensors"),
        "kv_bytes_per_token": MemoryFigure(kv_per_token, "gpu_memory: one real sequence"),
    }
    budget = Budget(gpu_memory_gib=capacity / GIB, context_len=budget_context)
    memory = memory_block(setup, measured, shape, dtype, device, budget, "", HeldKv())
    spec = PerfSpec(num_requests=1, concurrency=[1, "max"], **spec_fields)
    conc = float(fit) if fit else memory.max_concurrency
    levels, why = resolve_levels(spec, conc, None)
    why += f" ({'the largest batch that fit at ' + str(budget_context) + ' tokens' if fit else 'the formula'})"
    workload = workload_for(spec, levels, why, seed=1234)
    t0 = time.time()
    m = perf_hf.measure(model, NoTokenizer(), lambda: kv_cache.new_cache(model.config, setup), device, workload)
    stored = PhaseRecord(
        key="gpu-run",
        status="ok",
        workload=workload.as_dict(),
        levels=summarize(m, workload),
        notes=m.notes,
        budget_concurrency=conc,
        seconds=round(time.time() - t0, 2),
    )
    ceil = Ceilings.model_validate(ceilings_probe) if ceilings_probe and not ceilings_probe.get("error") else None
    perf, flags = performance_block(setup, stored, "gpu-run", memory, shape, dtype, ceil)
    assert perf is not None
    return {
        "setup": setup.name,
        "budget": budget.describe(),
        "performance": perf.model_dump(mode="json"),
        "flags": flags,
    }


def weight_setups(spec: str, kvs: list[str]) -> list[tuple[Any, list[Any]]]:
    """(the weights-only setup, the setups with each KV cache) per weight precision asked for."""
    from qeval.config.setups import Setup

    out = []
    for w in spec.split(","):
        weights = None if w == "16" else w
        group = 128 if w == "int4" else None
        base = "w16" if w == "16" else w
        with_kv = [
            Setup.model_validate(
                {
                    "name": base if kv == "auto" else f"{base}-kv-{kv}",
                    "weights": weights,
                    "group_size": group,
                    "kv_cache": kv,
                }
            )
            for kv in kvs
        ]
        plain = Setup.model_validate({"name": base, "weights": weights, "group_size": group})
        out.append((with_kv[0] if kvs[0] == "auto" else plain, with_kv))
    return out


class Target:
    """The 7B-class model of phases 3 and 4: its config, shape and dtype, and the device's meter."""

    def __init__(self, args: argparse.Namespace, shp: dict[str, Any], baseline: int | None) -> None:
        import torch
        from gpu_memory import Meter, model_config

        from qeval.model.shape import ModelShape

        self.contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else list(shp["contexts"])
        self.config = model_config(args.model_config, shrink=args.shape == "small", max_context=max(self.contexts))
        self.shape = ModelShape.from_config(self.config)
        on_cpu = args.device == "cpu"  # float32 there: this CPU emulates bfloat16 matmuls 100x slower
        self.dtype_name = (
            "float32" if on_cpu else str(self.config.get("torch_dtype") or self.config.get("dtype") or "bfloat16")
        )
        self.dtype = getattr(torch, self.dtype_name)
        self.meter = Meter(args.device, shp["cpu_capacity_mib"] * 2**20 if on_cpu else None, baseline)

    def describe(self, args: argparse.Namespace) -> dict[str, Any]:
        cfg = args.model_config
        return {
            "config": str(cfg.relative_to(ROOT) if cfg.is_relative_to(ROOT) else cfg),
            "shrunk": args.shape == "small",
            "model_type": self.config["model_type"],
            "dtype": self.dtype_name,
            "parameters": self.shape.n_params(),
            "layer_kinds": sorted(set(self.shape.kinds())),
            "sliding_window": self.shape.sliding_window,
            "contexts": self.contexts,
            "capacity_bytes": self.meter.capacity,
            "nvml_baseline_bytes": self.meter.nvml_baseline,
            "capacity_source": "simulated device (scripts/gpu_memory.py, Meter.admit)"
            if args.device == "cpu"
            else "torch.cuda.mem_get_info",
        }


def one_precision(
    run: Run, t: Target, base: Any, setups: list[Any], probe: dict[str, Any] | None, cell_s: float
) -> None:
    """Build the model at one weight precision; every KV cache and context's memory cells; then the
    performance phase on its weights-only setup. The model is freed before the next precision."""
    from gpu_memory import build_model, measure_setup

    from qeval.memory.ledger import model_weights_bytes

    args, shp, meter = run.args, run.shape, t.meter
    meter.clean()
    before = meter.allocated()
    t0 = time.monotonic()
    model, info = build_model(t.config, base, t.dtype, args.device)
    meter.sync()
    weights: dict[str, Any] = {
        "measured": model_weights_bytes(model),
        "allocator": meter.allocated() - before,
        "build_s": round(time.monotonic() - t0, 1),
        "quantization": info,
    }
    try:
        for setup in setups:  # the last 30 s stay for the performance phase and the files
            run.data["memory"] += measure_setup(
                model,
                setup,
                t.shape,
                t.dtype_name,
                t.contexts,
                meter,
                args.device,
                weights,
                shp["max_batch"],
                run.deadline - 30,
                cell_s,
            )
            run.save()
        if "perf" in args.skip.split(","):
            return
        if run.left() < (25 if args.shape == "full" else 0):
            run.data["skipped"].append(f"performance {base.name}: {max(run.left(), 0):.0f} s left")
            return
        mine = [c for c in run.data["memory"] if c["setup"] == base.name and "one_sequence" in c]
        kv = mine[0]["one_sequence"]["kv_bytes_per_token"] if mine else predictions_kv(t, base)
        fit = next((c["search"]["fit"] for c in mine if c["context"] == max(t.contexts)), None)
        meter.clean()
        run.data["performance"].append(
            performance(
                model,
                base,
                t.shape,
                t.dtype_name,
                args.device,
                meter.capacity,
                weights["measured"],
                kv,
                probe,
                shp["perf"],
                max(t.contexts),
                fit,
            )
        )
    finally:
        del model
        meter.clean()


def predictions_kv(t: Target, setup: Any) -> int:
    from qeval.memory.ledger import predict_kv_bytes_per_token

    return predict_kv_bytes_per_token(t.shape, setup, t.dtype_name)


def memory_and_perf(run: Run, probe: dict[str, Any] | None) -> None:
    """Phases 3 and 4, one weight precision at a time (one model on the device at once)."""
    from gpu_memory import SOURCES

    t = Target(run.args, run.shape, run.data.get("nvml_baseline_bytes"))
    run.data["model"] = t.describe(run.args)
    run.data["memory_sources"] = SOURCES
    run.data.setdefault("memory", [])
    run.data.setdefault("performance", [])
    precisions = weight_setups(run.args.weights, run.args.kv.split(","))
    for i, (base, setups) in enumerate(precisions):
        if run.args.shape == "small":
            cell_s = run.shape["cell_s"]
        else:  # this precision's share of what is left, 70% of it to the searches, split over its cells
            share = max(run.left(), 0) / (len(precisions) - i)
            cell_s = max(10.0, 0.7 * share / (len(setups) * len(t.contexts)))
        run.phase(
            f"memory+perf {base.name}",
            functools.partial(one_precision, run, t, base, setups, probe, cell_s),
            needs_s=20 if run.args.shape == "full" else 1,
        )


class Tiny:
    """Phase 1: `qeval run` of the tiny model on the device and on the CPU, started together. The
    device's run is awaited before the 7B-class model takes the device; the CPU's runs on beside
    the later phases (on a quarter of the cores) and is collected last."""

    def __init__(self, run: Run, work: Path) -> None:
        args = run.args
        self.run, self.work = run, work
        self.dtype = args.tiny_dtype or ("bfloat16" if args.device == "cuda" else "float32")
        self.setups = args.tiny_setups.split(",") if args.tiny_setups else run.shape["tiny_setups"]
        self.limit = args.tiny_limit or run.shape["tiny_limit"]
        self.procs: dict[str, tuple[subprocess.Popen[str], Path]] = {}
        self.cpu_threads = cpu_threads()
        self.got: dict[str, dict[str, Any]] = {}

    def start(self) -> None:
        for role, device in (("device", self.run.args.device), ("cpu", "cpu")):
            self.procs[role] = start_tiny(role, device, self.dtype, self.setups, self.limit, self.work)
        self._wait("device", self.run.left() - 60)

    def finish(self) -> None:
        self._wait("cpu", self.run.left() - 5)
        got = self.got
        self.run.data["tiny"] = {
            "dtype": self.dtype,
            "limit": self.limit,
            "setups": self.setups,
            "tasks": TINY_TASKS,
            "note": f"the CPU run ran beside phases 2 to 4 on {self.cpu_threads} threads",
            "device_run": got.get("device", {}),
            "cpu_run": got.get("cpu", {}),
            "comparison": compare_scores(got.get("device", {}), got.get("cpu", {})),
        }
        bad = [f"{role}: exit {r['exit_code']}" for role, r in got.items() if r["exit_code"] != 0]
        if bad:
            raise RuntimeError("tiny-model run failed: " + "; ".join(bad))

    def _wait(self, role: str, timeout: float) -> None:
        if role in self.procs and role not in self.got:
            proc, out = self.procs[role]
            self.got[role] = finish_tiny(proc, out, timeout)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.bundle is not None and not os.environ.get(SITE_ENV):
        install_bundle(args.bundle, argv)  # does not return
    if args.device == "cuda":
        from gpu_memory import nvml_used_now

        baseline = nvml_used_now()  # before this process (or its tiny runs) makes a CUDA context
        import torch

        if not torch.cuda.is_available():
            print(
                "gpu_run: --device cuda but torch sees no CUDA device (use --device cpu --shape small)", file=sys.stderr
            )
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args, SHAPES[args.shape])
    if args.device == "cuda":
        run.data["nvml_baseline_bytes"] = baseline
    run.data["environment"] = environment(args.device)
    run.save()
    with tempfile.TemporaryDirectory(prefix="qeval-gpu-run-") as tmp:
        tiny = Tiny(run, Path(tmp))
        run.phase("tiny", tiny.start, needs_s=30)
        try:
            probe = run.phase(
                "ceilings",
                lambda: ceilings(
                    args.device, "float32" if args.device == "cpu" else "bfloat16", run.shape["ceilings_s"]
                ),
                needs_s=20,
            )
            run.data["ceilings"] = probe
            run.save()
            if "memory" not in args.skip.split(","):
                memory_and_perf(run, probe)
        finally:  # the CPU's tiny run is collected (or stopped) whatever happened above
            if tiny.procs:
                run.phase("tiny-cpu", tiny.finish)
    run.data["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    run.data["environment"]["forbidden_imports_loaded"] = sorted(  # the GPU image has neither
        m for m in ("lm_eval", "vllm") if sys.modules.get(m) is not None
    )
    run.save()
    print(
        f"gpu_run: {run.data['seconds']:.0f} s (budget {args.time_budget:.0f} s); {len(run.data['errors'])} "
        f"error(s), {len(run.data['skipped'])} skipped; wrote {args.out / 'gpu-run.json'} and gpu-run.md",
        flush=True,
    )
    print((args.out / "gpu-run.md").read_text(), flush=True)
    return 1 if run.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
