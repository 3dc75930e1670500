"""gpu-run.md: scripts/gpu_run.py's record (gpu-run.json) as tables a reader can paste into
docs/memory.md and docs/benchmarks.md. Made from the record alone, after every phase."""

from __future__ import annotations

from typing import Any

GIB, MIB = 2**30, 2**20


def size(n: float | None) -> str:
    """Bytes as GiB past one GiB, else MiB; an em dash for none."""
    if n is None:
        return "—"
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.2f} MiB"


def ratio(measured: float | None, predicted: float | None) -> str:
    if not measured or not predicted:
        return ""
    return f" ({(measured - predicted) / predicted:+.1%})"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def memory_rows(cells: list[dict[str, Any]]) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """Residents (predicted beside measured) and concurrency (formula beside what fit), per cell."""
    res, conc = [], []
    order = {name: i for i, name in reversed(list(enumerate(c["setup"] for c in cells)))}
    for c in sorted(cells, key=lambda c: (order[c["setup"]], c["context"])):  # run longest context first
        p = c["predicted"]
        name = [c["setup"], str(c["context"])]
        if "skipped" in c:
            res.append(name + ["skipped: " + c["skipped"]] + [""] * 5)
            continue
        one, w = c["one_sequence"], c["weights_measured"]
        s = c["search"]
        fit = s.get("at_fit") or {}
        res.append(
            name
            + [
                f"{size(p['weights_bytes'])} / {size(w['measured'])}{ratio(w['measured'], p['weights_bytes'])}",
                f"{size(p['kv_bytes_per_sequence'])} / {size(one['kv_bytes_per_sequence'])}"
                f"{ratio(one['kv_bytes_per_sequence'], p['kv_bytes_per_sequence'])}",
                size(one["prefill_activations_bytes"]),
                size(fit.get("step_activations_bytes")),
                f"{size(fit.get('allocator_slack_bytes'))} / {size(fit.get('runtime_overhead_bytes'))}",
            ]
        )
        raw, default = c["formula"]["raw"]["max_concurrency"], c["formula"]["default_budget"]["max_concurrency"]
        got = s["fit"]
        upper = "capped" if s["capped"] else (f"fails at {s['failed_at']}" if s["failed_at"] else "not bracketed")
        pool_pred = got * p["kv_bytes_per_sequence"] if got else None
        conc.append(
            name
            + [
                f"{default:g}",
                f"{raw:g}",
                f"{got} ({upper}; {len(s['trials'])} trials)",
                f"{got / raw:.0%}" if raw else "—",
                f"{size(pool_pred)} / {size(fit.get('kv_pool_bytes'))}{ratio(fit.get('kv_pool_bytes'), pool_pred)}",
            ]
        )
    return ["setup", "context"], res, conc


def perf_rows(perfs: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for entry in perfs:
        p = entry["performance"]
        dec, pre = p.get("decode") or {}, p.get("prefill") or {}
        levels = p.get("levels") or []
        top = levels[-1] if levels else {}
        rows.append(
            [
                entry["setup"],
                ", ".join(str(x["concurrency"]) for x in levels),
                f"{dec.get('achieved', 0):,.1f} / {dec.get('ceiling', 0):,.0f} ({dec.get('share', 0):.0%})"
                if dec
                else "—",
                f"{pre.get('achieved', 0):,.0f} / {pre.get('ceiling', 0):,.0f} ({pre.get('share', 0):.0%})"
                if pre
                else "—",
                f"{top.get('output_tokens_per_s', {}).get('median', 0):,.1f}" if top else "—",
            ]
        )
    return rows


def markdown(data: dict[str, Any]) -> str:
    """The whole page."""
    env = data.get("environment") or {}
    model = data.get("model") or {}
    lines = [
        f"# qeval on {env.get('device_name', data['device'])}: memory, performance, the tiny model's scores",
        "",
        f"{data['started']}; `{data['command']}`; {data.get('seconds', 0):.0f} s of a "
        f"{data['time_budget_s']:.0f} s budget. torch {env.get('torch')} (CUDA {env.get('cuda')}), "
        + ", ".join(f"{k} {v}" for k, v in (env.get("libraries") or {}).items())
        + ".",
        "",
        data["note"],
        "",
    ]
    if model:
        lines += [
            f"Model: `{model['config']}`{' (shrunk for the CPU test)' if model['shrunk'] else ''}, "
            f"{model['model_type']}, {model['parameters']:,} parameters, {model['dtype']}, random weights; "
            f"device memory {size(model['capacity_bytes'])} ({model['capacity_source']}).",
            "",
        ]
    cells = data.get("memory") or []
    if cells:
        key, res, conc = memory_rows(cells)
        lines += ["## Memory: predicted / measured", ""]
        lines += table(
            key
            + [
                "weights",
                "KV, one sequence",
                "activations: prefill of one",
                "activations: decode step at the fit",
                "allocator slack / runtime overhead",
            ],
            res,
        )
        lines += [
            "",
            "## Concurrency: the formula against what fit",
            "",
            "`default` is qeval's budget (90% of the device, 1 GiB overhead, 5% margin); `raw` holds nothing "
            "back: the theoretical concurrency. `fit` is the most sequences whose caches at the context and one "
            "batched decode step ran before an out-of-memory error.",
            "",
        ]
        lines += table(key + ["default", "raw", "fit", "fit / raw", "KV pool at the fit: predicted / measured"], conc)
        lines.append("")
    perfs = data.get("performance") or []
    if perfs:
        lines += [
            "## Performance against the ceilings",
            "",
            "decode: tokens/s at concurrency 1 / its bandwidth ceiling; prefill: tokens/s at the top level / its "
            "matmul ceiling (qeval/perf/block.py).",
            "",
        ]
        lines += table(
            ["setup", "levels", "decode (share)", "prefill (share)", "output tokens/s at the top"], perf_rows(perfs)
        )
        lines.append("")
    tiny = data.get("tiny")
    if tiny:
        lines += [
            f"## The tiny model: {data['device']} against CPU ({tiny['dtype']}, {tiny['limit']} samples a task)",
            "",
        ]
        lines += table(
            ["setup", "task", "metric", data["device"], "cpu", "difference"],
            [
                [r["setup"], r["task"], r["metric"], _num(r["device"]), _num(r["cpu"]), _num(r["diff"])]
                for r in tiny["comparison"]
            ],
        )
        lines.append("")
    if data.get("skipped") or data.get("errors"):
        lines += ["## Skipped and failed", ""]
        lines += [f"- skipped: {s}" for s in data.get("skipped", [])]
        lines += [f"- failed: {e['phase']}: {e['error']}" for e in data.get("errors", [])]
        lines.append("")
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"
