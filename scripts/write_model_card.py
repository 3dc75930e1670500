"""Write models/qeval-tiny/README.md and scores.json from a full (no --limit) demo run.

    .venv/bin/qeval run configs/demo.yaml --output reports/card --force
    .venv/bin/python scripts/write_model_card.py reports/card/results.json

scores.json is what tests/e2e/test_model_card.py checks a fresh run against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from tiny_corpus import N_LANGUAGE_FACTS as N_LANG  # noqa: E402

MODEL = ROOT / "models" / "qeval-tiny"
PRIMARY = {"compare_mc": "acc", "addition": "exact_match", "facts": "exact_match", "ppl": "bits_per_byte"}


def main() -> None:
    results = json.loads(Path(sys.argv[1]).read_text())
    assert results["run"]["limit"] is None, "the card needs a full run (no --limit)"
    cfg = json.loads((MODEL / "config.json").read_text())
    train = json.loads((MODEL / "training_args.json").read_text())
    scores = {
        s["name"]: {t: {m: v["value"] for m, v in d["metrics"].items()} for t, d in s["tasks"].items()}
        for s in results["setups"]
        if s["status"] == "ok"
    }
    deltas = {
        s["name"]: {
            t: {"delta": c["delta"], "ci": c["ci"], "p_value": c["p_value"]} for t, c in s["vs_baseline"].items() if c
        }
        for s in results["setups"]
        if not s["baseline"] and s["status"] == "ok"
    }
    weights = {s["name"]: s["memory"]["weights_bytes"]["measured"] for s in results["setups"]}
    (MODEL / "scores.json").write_text(
        json.dumps(
            {
                "command": "qeval run configs/demo.yaml",
                "scores": scores,
                "vs_baseline": deltas,
                "weights_bytes": weights,
            },
            indent=2,
        )
        + "\n"
    )
    (MODEL / "README.md").write_text(_card(cfg, train, results, scores, deltas))


def _timing() -> str:
    """The wall time from the training log shipped beside the weights."""
    log = MODEL / "training_log.txt"
    last = [x for x in log.read_text().splitlines() if x.startswith("saved to")] if log.is_file() else []
    import re

    m = re.search(r"after (\d+)s", last[-1]) if last else None
    if not m:
        return ""
    sec = int(m.group(1))
    return (
        f"Trained from scratch in {sec} s ({sec / 60:.0f} min) on the 2-core development machine, "
        "alone on it; that rerun reproduced the shipped weights byte for byte (training_log.txt)."
    )


def _fmt(task: str, v: float) -> str:
    return f"{v:.4f}" if PRIMARY[task] == "bits_per_byte" else f"{100 * v:.1f}%"


def _card(cfg: dict, train: dict, results: dict, scores: dict, deltas: dict) -> str:
    tasks = list(PRIMARY)
    rows = ["| setup | " + " | ".join(f"{t} ({PRIMARY[t]})" for t in tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for name, sc in scores.items():
        cells = []
        for t in tasks:
            cell = _fmt(t, sc[t][PRIMARY[t]])
            if name in deltas and t in deltas[name]:
                d = deltas[name][t]
                scale, unit = (1, "") if PRIMARY[t] == "bits_per_byte" else (100, " pts")
                digits = 4 if scale == 1 else 1
                lo, hi = scale * d["ci"][0], scale * d["ci"][1]
                cell += f" ({scale * d['delta']:+.{digits}f}{unit}, CI [{lo:+.{digits}f}, {hi:+.{digits}f}])"
            cells.append(cell)
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(rows)
    return f"""# qeval-tiny

A small language model trained by the qeval project so that qeval can run, and be
tested, with no model hub in reach. It is the demo model of `make run`.

## Architecture

Llama (`LlamaForCausalLM`, loads unchanged in transformers and vLLM) with grouped-query
attention: {cfg["num_hidden_layers"]} layers, hidden size {cfg["hidden_size"]}, MLP size
{cfg["intermediate_size"]}, {cfg["num_attention_heads"]} attention heads and
{cfg["num_key_value_heads"]} KV heads (head dim {cfg["hidden_size"] // cfg["num_attention_heads"]}),
vocabulary {cfg["vocab_size"]} (a character-level tokenizer of its own: printable ASCII,
newline, `<pad> <s> </s> <unk>`), untied embeddings, context {cfg["max_position_embeddings"]} tokens.
{int(train["params"]):,} parameters, stored as bfloat16 safetensors
({(MODEL / "model.safetensors").stat().st_size / 2**20:.2f} MiB).

## Training data and command

Generated text, one fact or problem per line, 1-4 lines per document (`scripts/tiny_corpus.py`):
two-digit additions (`23 + 58 = 81`, the 800 pairs of the scored and perplexity splits
held out), largest/smallest of four two-digit numbers (the 400 scored questions held out),
and ISO codes of countries (alpha-2) and of {N_LANG} languages (ISO 639-3) from pycountry,
memorised on purpose. Regenerate everything deterministically:

```bash
.venv/bin/python scripts/make_tasks.py                 # tasks/ (data + YAML with sha256)
.venv/bin/python scripts/train_tiny_model.py           # models/qeval-tiny/ ({train["steps"]} steps)
```

Training: AdamW (lr {train["lr"]}, cosine, 200 warm-up steps), batch {train["batch"]} documents,
float32 on the CPU with 2 threads, seed 1234; saved in bfloat16. {_timing()}

## Scores

Measured by qeval's transformers backend (`bf16` is the model as shipped) on the
400-sample scored splits, `{results["run"]["device"]}`, qeval {results["run"]["qeval_version"]}:

```bash
.venv/bin/qeval run configs/demo.yaml      # = make run; scores land in reports/demo/
```

{table}

In parentheses: the difference from bf16 with its 95% CI (Newcombe's paired score interval
for accuracies, a paired bootstrap for bits per byte). For `ppl` (bits per byte) lower is
better; it follows lm-evaluation-harness's convention (docs/tasks.md): every token of a
document is scored, the first from the prefix token, and this tokenizer's own BOS is among
them (scored given the prefix BOS), which the model never saw twice in a row in training:
that one token adds about 0.2 bits per byte to these short documents. int8/int4 are
optimum-quanto round-to-nearest weights (int8 per channel; int4 group 128, which here is one
group per row); kv-int4/kv-int2 are transformers' `QuantizedCache` with the quanto backend,
one group per head vector; int4-kv-int4 is both. `tests/e2e/test_model_card.py` reruns this
and checks the numbers in `scores.json`.
"""


if __name__ == "__main__":
    main()
