"""The device's physical limits, measured once per run on the device the setups run on:
copy bandwidth (what decode at batch 1 is bound by: every weight byte and the KV cache are
read for each token) and matmul peak (what prefill is bound by: 2 FLOPs per parameter per
prompt token). Per setup (qeval/perf/block.py):

    decode ceiling  = copy bandwidth / (weight bytes read per token + KV bytes at the context)
    prefill ceiling = matmul peak / (2 x parameters every prompt token multiplies)

    python -m qeval.perf.ceilings OUT.json DEVICE DTYPE

The runner runs this in a fresh process of the workers' interpreter before the setups (so no
setup's memory sees it, and the torch build and threads are the workers'), and stores the
figures in RUN_DIR/ceilings.json; a resumed run reuses them when device and hardware match.

The copy is sized past the caches: a ceiling a setup beats means the probe was wrong (a
share over 1 is flagged, never clipped). The matmuls are sized by time, not fixed: each grows
until one call takes 50 ms, so the whole probe takes at most BUDGET_S (10 s) on any device,
and each figure's `source` names the size it was measured at."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.files.atomic import atomic_write_json
from qeval.files.processes import die_with_parent
from qeval.perf.stats import measured

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore

PROBE_VERSION = "2"
REPEATS = 5
#: the whole probe's wall-time bound on any device, however slow (a CPU that emulates bfloat16
#: runs a 2048^3 matmul in 60 s: the fixed-size probe of version 1 took 785 s there)
BUDGET_S = 10.0
#: one timed call should take at least this long to be a measurement, not timer noise
TARGET_S = 0.05
_DTYPES = ("float32", "bfloat16", "float16")
#: probes this process made, by key: a sweep probes each device once, not once per model
_MEASURED: dict[str, dict[str, Any]] = {}
#: the probe process's own limit: the budget, plus torch's import and a cold start
PROCESS_TIMEOUT_S = 120


def last_level_cache_bytes() -> int | None:
    """The CPU's largest cache (Linux sysfs), e.g. 32 MiB of L3; None where unreadable."""
    best = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        value = int(size.rstrip("KMG")) * mult
        best = max(best or 0, value)
    return best


def _timed(op: Callable[[], Any], sync: Callable[[], None], min_s: float = TARGET_S) -> float:
    """Seconds per call of `op`, over enough calls to fill min_s (a fast GPU copy is microseconds)."""
    op()
    sync()
    calls, t0 = 0, time.perf_counter()
    while True:
        op()
        calls += 1
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return elapsed / calls


def _repeat(op: Callable[[], Any], sync: Callable[[], None], deadline: float) -> list[float]:
    """Seconds per call, up to REPEATS times, as many as fit before `deadline` (at least one)."""
    times = [_timed(op, sync)]
    while len(times) < REPEATS and time.perf_counter() + 2.5 * max(max(times), TARGET_S) < deadline:
        times.append(_timed(op, sync))
    return times


def _sized_matmul(
    make: Callable[[int], Callable[[], Any]], sync: Callable[[], None], n_max: int, deadline: float
) -> tuple[int, list[float]]:
    """Grow a square matmul from 128 by doubling until one call takes TARGET_S (or n_max, or
    the next size would not fit the time left), then time it: the size follows the device's
    speed, so a fast GPU is measured on a large problem and an emulated dtype in a second."""
    n = 128
    while True:
        op = make(n)
        t0 = time.perf_counter()
        op()
        sync()
        once = time.perf_counter() - t0
        # the next size costs 8x: grow only while it and its repeats fit the time left
        if once >= TARGET_S or 2 * n > n_max or time.perf_counter() + 8 * once * (REPEATS + 2) > deadline:
            return n, [2 * n**3 / t for t in _repeat(op, sync, deadline)]
        n *= 2


def probe(device: str, dtype: str, budget_s: float = BUDGET_S) -> dict[str, Any]:
    """Copy bandwidth and matmul peaks (the model dtype, and int8 where torch offers it) on
    `device`, within `budget_s` seconds in all: each measurement is sized by time."""
    import torch

    start = time.perf_counter()
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cache, nbytes, copies = _copies(device, sync, start + 0.2 * budget_s)
    n_max = 8192 if device == "cuda" else 2048
    tdt = getattr(torch, dtype)
    # the model dtype's share of the time left, then int8's: both bounded by the same budget
    mid = time.perf_counter() + 0.5 * (start + budget_s - time.perf_counter())

    def float_mm(n: int) -> Callable[[], Any]:
        a, b = torch.randn(n, n, device=device).to(tdt), torch.randn(n, n, device=device).to(tdt)
        return lambda: torch.matmul(a, b)

    n, rates = _sized_matmul(float_mm, sync, n_max, mid)
    peaks = {
        dtype: measured(
            rates,
            "FLOP/s",
            f"torch.matmul of two {n}x{n} {dtype} matrices (size grown until one "
            f"call took {1000 * TARGET_S:.0f} ms, at most {n_max}): 2 n^3 / time; "
            "best of the repeats is the ceiling",
        )
    }
    peaks.update(_int8_peak(device, sync, n_max, start + budget_s))
    name = torch.cuda.get_device_name(0) if device == "cuda" else _cpu_name()
    past = "8x" if device == "cuda" else "2x"
    return {
        "device": device,
        "device_name": name,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cache_bytes": cache or None,
        "probe_s": round(time.perf_counter() - start, 2),
        "copy_bandwidth": measured(
            copies,
            "bytes/s",
            f"Tensor.copy_ of {nbytes / 2**20:.0f} MiB ({past} the largest cache or more): "
            "bytes read + bytes written / time; best of the repeats is the ceiling",
        ),
        "matmul_peak": {k: v for k, v in peaks.items() if "unavailable" not in k},
        "notes": [v["reason"] for k, v in peaks.items() if "unavailable" in k],
    }


def _copies(device: str, sync: Callable[[], None], deadline: float) -> tuple[int, int, list[float]]:
    """The largest cache's bytes, the copy's bytes and its rates (bytes read + written per
    second), repeated until `deadline`."""
    import torch

    cache = (torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else last_level_cache_bytes()) or 0
    # the copy stays sized past the caches (a cached copy would overstate DRAM bandwidth)
    # (twice the last level: a VM reports the whole socket's L3, 480 MiB on these EPYCs/Xeons, and 8x
    # that took 6 s just to allocate and touch; src + dst at 2x each stream 4x the cache per call)
    nbytes = min(max(256 * 2**20, 2 * cache), 2 * 2**30) if device != "cuda" else max(2 * 2**30, 8 * cache)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copies = [2 * nbytes / t for t in _repeat(lambda: dst.copy_(src), sync, deadline)]
    return cache, nbytes, copies  # the tensors go with the frame: the memory is back before the matmuls


def _int8_peak(device: str, sync: Callable[[], None], n_max: int, deadline: float) -> dict[str, Any]:
    """`int8`: the int8 matmul's peak, or `int8_unavailable` with the reason where this torch
    build or device has no int8 GEMM."""
    import torch

    try:

        def int_mm(n: int) -> Callable[[], Any]:
            ia = torch.randint(-128, 127, (n, n), dtype=torch.int8, device=device)
            ib = torch.randint(-128, 127, (n, n), dtype=torch.int8, device=device)
            return lambda: torch._int_mm(ia, ib)

        n8, rates8 = _sized_matmul(int_mm, sync, n_max, deadline)
        return {
            "int8": measured(
                rates8,
                "OP/s",
                f"torch._int_mm of two {n8}x{n8} int8 matrices (int32 accumulate; "
                f"size grown until one call took {1000 * TARGET_S:.0f} ms, at most "
                f"{n_max}): 2 n^3 / time; best of the repeats is the ceiling",
            )
        }
    except (RuntimeError, AttributeError) as exc:  # no int8 GEMM in this torch build or device
        return {"int8_unavailable": {"reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def ceilings_path(store: RunStore) -> Path:
    from qeval.files.names import inside

    return inside(store.root, "ceilings.json")


def ensure_ceilings(pre: Preflight, store: RunStore, python: str, remote: str | None = None) -> dict[str, Any] | None:
    """The run's stored ceilings when measured on this device and hardware, else measured now
    (a fresh process of `python`); None when performance is off. A failed probe is stored
    with its error and warned about: the setups then report figures without shares. `remote`:
    the Ray cluster the jobs run on (qeval/run/executors/address.py), whose nodes are not probed."""
    if not pre.cfg.performance.enabled:
        return None
    from qeval.records.keys import key_of
    from qeval.records.provenance import hardware

    key = key_of(
        {
            "device": pre.device,
            "hardware": json.dumps(hardware(), sort_keys=True),
            "python": python,
            "dtype": pre.dtype,
            "probe": PROBE_VERSION,
        }
    )
    path = ceilings_path(store)
    stored = _stored(path, key)
    if stored is not None:
        return stored
    if remote is not None:  # the jobs run on the cluster's nodes; this driver's device says nothing of theirs
        err = f"not measured: the jobs run on the Ray cluster at {remote}, whose nodes the driver does not probe"
        print(f"qeval: the ceilings were {err}; no shares of the ceiling", file=sys.stderr)
        atomic_write_json(path, {"key": key, "error": err})
        return None
    if key in _MEASURED:  # a sweep's models on one device: measured once, stored in each run directory
        atomic_write_json(path, _MEASURED[key])
        return _MEASURED[key]
    print(f"qeval: measuring {pre.device} copy bandwidth and matmul peak (once per run)", file=sys.stderr)
    result = _run_probe(python, pre, path.with_name("ceilings.probe.json"), key)
    atomic_write_json(path, result)
    if not result.get("error"):
        _MEASURED[key] = result
    return result


def _stored(path: Path, key: str) -> dict[str, Any] | None:
    """The stored ceilings at `path` where they are under `key` and measured (no error)."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return stored if isinstance(stored, dict) and stored.get("key") == key and not stored.get("error") else None


def _run_probe(python: str, pre: Preflight, tmp: Path, key: str) -> dict[str, Any]:
    """The probe run in a fresh process of `python` (writing `tmp`): its ceilings, or the error
    it ended with (warned about)."""
    t0 = time.time()
    try:  # dies with this process (a killed `qeval run` leaves no probe racing the rerun for its file)
        proc = subprocess.run(
            [python, "-m", "qeval.perf.ceilings", str(tmp), pre.device, pre.dtype],
            capture_output=True,
            text=True,
            check=False,
            timeout=PROCESS_TIMEOUT_S,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess([], 1, "", f"the probe took over {PROCESS_TIMEOUT_S} s and was stopped")
    if proc.returncode == 0 and tmp.is_file():
        result = json.loads(tmp.read_text()) | {"key": key, "seconds": round(time.time() - t0, 2)}
        tmp.unlink()
    else:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"qeval: warning: the ceilings probe failed ({err}); no shares of the ceiling", file=sys.stderr)
        result = {"key": key, "error": err}
    return result


def read_ceilings(store: RunStore) -> dict[str, Any] | None:
    """The stored ceilings of a run directory (None when absent, unreadable or failed)."""
    path = ceilings_path(store)
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return stored if isinstance(stored, dict) and not stored.get("error") else None


def main() -> None:
    out, device, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
    if dtype not in _DTYPES:
        raise SystemExit(f"unknown dtype {dtype}")
    atomic_write_json(Path(out), probe(device, dtype))


if __name__ == "__main__":
    main()
