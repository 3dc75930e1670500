"""What `qeval advise` writes: advice.md (the sensitivity table, the chosen mix, the advised
setup as a YAML snippet, the held-out check), advice.html (the same with the layer x module
type heatmap as inline SVG) and advice.json."""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

import yaml

from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes, atomic_write_json
from qeval.report.plots import sensitivity_heatmap, svg_of
from qeval.report.tables import md_table
from qeval.results.advice import Advice, AdviceUnit


def setup_snippet(advice: Advice) -> str:
    """The advised setup as the YAML to paste under a config's `setups:`."""
    setup = advice.model_dump(mode="json", include={"setup"})["setup"]
    if advice.search.kl_target is None:  # the weight advice: its keep list, even where empty
        setup["keep"] = list(setup.get("keep", []))
    else:  # the KV advice: its kept layers as a config writes them (none: the uniform cache is within target)
        setup["kv_keep"] = [int(x) if x.isdigit() else x for x in advice.setup.kv_keep]
    return yaml.safe_dump([setup], sort_keys=False, default_flow_style=None, width=100)


def _kl(x: float) -> str:
    return f"{x:.5f}"


def markdown(advice: Advice) -> str:
    """advice.md."""
    c = advice.calibration
    kv = advice.search.kl_target is not None
    lines = [
        f"# {'Per-layer KV' if kv else 'Mixed-precision'} advice: {advice.target.name}",
        "",
        f"Model `{advice.model}` in {advice.dtype} on {advice.device}; "
        + (
            f"{advice.budget_basis}."
            if kv
            else f"budget {advice.budget} ({advice.budget_bytes:,} bytes: {advice.budget_basis})."
        ),
        "",
        f"Calibration: {c.tokens} tokens in {c.documents} documents of {c.source}; KL(baseline || "
        f"candidate) on the baseline's top-{c.top_k} ids plus a tail bucket, mean per token.",
        "",
        f"Uniform {advice.target.name}: KL {_kl(advice.uniform_kl)}.",
        "",
        "## Sensitivity",
        "",
        "cost: KL with only this unit quantized; gain: KL recovered with only this unit kept at "
        f"{advice.dtype} in an otherwise quantized model; bytes: what keeping it adds"
        + (" per token of KV cache." if kv else "."),
        "",
    ]
    lines += md_table(
        ["unit" if not kv else "unit (kind)", "bytes kept", "cost (KL)", "gain (KL)", "gain per MiB"],
        [
            [
                f"{r.unit} ({r.kind})" if kv and r.layer is not None else r.unit,
                f"{r.extra_bytes:,}",
                _kl(r.cost_kl),
                _kl(r.gain_kl),
                f"{r.gain_kl / max(r.extra_bytes, 1) * 2**20:.5f}",
            ]
            for r in advice.rows
        ],
    )
    chosen = _kv_chosen_lines(advice) if kv else _chosen_lines(advice)
    return "\n".join(lines + chosen + _heldout_lines(advice) + _cost_lines(advice))


def _kv_chosen_lines(advice: Advice) -> list[str]:
    """advice.md's chosen KV assignment: what the search kept, the setup's YAML, its memory beside
    the uniform caches' and the `vllm serve` line that serves it."""
    s = advice.search
    lines = _chosen_section(
        advice,
        "Chosen assignment",
        f"Kept at {advice.dtype}: {', '.join(s.kept) or 'no layer'} (+{s.extra_bytes:,} bytes per token). "
        f"KL target {s.kl_target:g}: predicted {_kl(s.predicted_kl)} (gains added), measured on the "
        f"calibration slice {_kl(s.measured_calib_kl)}"
        + (
            ""
            if s.kl_target is None or s.measured_calib_kl <= s.kl_target
            else " (above the target: every layer but one kept)"
        )
        + f"; the uniform {advice.target.name} cache {_kl(advice.uniform_kl)}.",
    )
    if advice.kv_plan:
        contexts = sorted(advice.kv_plan[0].sequence_bytes)
        lines += md_table(
            ["setup", "KV", "kept", "bytes per token", *(f"sequences at {c:,}" for c in contexts), "accounting"],
            [
                [r.setup, r.kv_cache, ", ".join(r.kv_keep) or "-", f"{r.kv_bytes_per_token:,}"]
                + [f"{r.sequences[c]:,.1f}" for c in contexts]
                + [r.engine]
                for r in advice.kv_plan
            ],
        )
        lines += ["", "Sequences: what the config's budget holds of the KV cache at that context.", ""]
    if advice.serve_line:
        lines += ["Served on vLLM (0.32):", "", "```", advice.serve_line, "```", ""]
    return lines


def _chosen_lines(advice: Advice) -> list[str]:
    """advice.md's chosen mix: the search's pick and the advised setup's YAML."""
    s = advice.search
    return _chosen_section(
        advice,
        "Chosen mix",
        f"{s.method.capitalize()} search over the layer x module-type cells: kept "
        f"{', '.join(s.kept) or 'nothing'} (+{s.extra_bytes:,} bytes of {s.allowance_bytes:,} "
        f"allowed). Predicted KL {_kl(s.predicted_kl)} (gains added), measured on the calibration "
        f"slice {_kl(s.measured_calib_kl)}.",
    )


def _chosen_section(advice: Advice, title: str, summary: str) -> list[str]:
    """advice.md's chosen section, weights or KV alike: its title, what the search kept (`summary`)
    and the advised setup's YAML to paste."""
    return ["", f"## {title}", "", summary, "", "```yaml", setup_snippet(advice).rstrip(), "```", ""]


def _heldout_lines(advice: Advice) -> list[str]:
    """advice.md's held-out check (none where there are no mixes): each mix's KL, and random
    mixes against the advisor's."""
    c, lines = advice.calibration, []
    if advice.mixes:
        lines += [
            "## Held-out check",
            "",
            f"{c.heldout_documents} documents the search never saw; the random mixes keep as many "
            "units of each kind (attention and MLP cells, or each attention kind's layers: the same bytes), "
            "drawn at random.",
            "",
        ]
        kv = advice.search.kl_target is not None
        lines += md_table(
            ["mix", "kept", "KV bytes per token" if kv else "weights bytes (predicted)", "KL"],
            [
                [m.name, ", ".join(m.kept) or "-", f"{(m.kv_bytes_per_token if kv else m.weights_bytes) or 0:,}"]
                + [_kl(m.heldout_kl)]
                for m in advice.mixes
            ],
        )
        v = advice.versus_random
        if v.ci95 is not None and v.mean_diff is not None:
            lines += [
                "",
                f"Random minus advisor, paired by document (mean over {v.draws} draws): "
                f"{v.mean_diff:+.5f} KL, 95% CI [{v.ci95[0]:+.5f}, {v.ci95[1]:+.5f}]; "
                f"{v.draws_beaten} of {v.draws} draws beaten beyond noise. "
                f"{v.verdict.capitalize()}.",
            ]
    return lines


def _cost_lines(advice: Advice) -> list[str]:
    """advice.md's cost: what the sensitivity and the whole run took."""
    t = advice.timing
    return [
        "",
        "## Cost",
        "",
        f"Sensitivity: {t.sensitivity_s:.1f} s for {int(t.passes)} forward passes over the slice "
        f"({t.seconds_per_pass:.2f} s each; the baseline's pass {t.baseline_pass_s:.2f} s); "
        f"loading {t.load_s:.1f} s; everything {t.total_s:.1f} s.",
        "",
    ]


def heatmap_svg(rows: list[AdviceUnit], value: str = "gain_kl") -> str:
    """Layer x module type, coloured by `value` (gain or cost), as an inline SVG string (the
    figure is the run report's too: qeval/report/plots.py)."""
    return svg_of(lambda r: sensitivity_heatmap(r, value), rows)


def html_page(advice: Advice, md: str) -> str:
    """advice.html: the heatmaps, then the markdown text as preformatted text."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>qeval advice</title></head><body>"
        f"<h1>Mixed-precision advice: {html.escape(advice.target.name)}</h1>"
        "<h2>Gain (KL recovered with only this cell kept)</h2>"
        + heatmap_svg(advice.rows, "gain_kl")
        + "<h2>Cost (KL with only this cell quantized)</h2>"
        + heatmap_svg(advice.rows, "cost_kl")
        + f"<pre>{html.escape(md)}</pre></body></html>"
    )


def advice_paths(output: Path) -> list[Path]:
    """advice.md at `output`, its .html and .json beside it."""
    return [output, output.with_suffix(".html"), output.with_suffix(".json")]


def check_advice_output(output: Path) -> None:
    """Refuse, before any work, an `--output` the advice could not be written to: a folder (or
    anything but a regular file) at one of its three paths, or a parent that is not a folder and
    cannot be made one (a file on the way)."""
    if output.suffix.lower() in (".html", ".json"):  # advice.html / .json would overwrite it
        raise UserError(
            f"--output {output}: name the advice.md file to write (its .html and .json go "
            "beside it), e.g. --output reports/advice.md"
        )
    for path in advice_paths(output):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise UserError(
                f"--output {output}: {path} exists and is not a regular file (a folder?); "
                "name the advice.md file to write"
            )
    parent = output.parent
    while not parent.exists() and parent != parent.parent:  # the first folder on the way that exists
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--output {output}: {parent} is not a folder")
    try:  # a folder nothing can be written in (/proc, a read-only mount): found now, not after every pass
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise UserError(f"--output {output}: cannot write in {parent} ({exc.strerror or exc})") from None


def write(advice: Advice, output: Path) -> list[Path]:
    """Write advice.md at `output` and its .html and .json beside it; returns the paths."""
    output.parent.mkdir(parents=True, exist_ok=True)
    md = markdown(advice)
    paths = advice_paths(output)
    atomic_write_bytes(paths[0], md.encode())
    atomic_write_bytes(paths[1], html_page(advice, md).encode())
    atomic_write_json(paths[2], advice.model_dump(mode="json"))
    return paths
