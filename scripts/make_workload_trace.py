"""Build the shipped workload trace, configs/workloads/gsm8k.jsonl, from real data, deterministically.

    .venv/bin/python scripts/make_workload_trace.py [--data tasks/lm_eval_full/data/gsm8k/test.jsonl]
        [--tokenizer models/smollm2-135m] [--requests 300] [--few-shot 60] [--seed 0]
        [--out configs/workloads/gsm8k.jsonl]

The requests are GSM8K's test problems (`make lm-eval-full` writes the 1,319 of them; the 24-problem
fixture under tasks/lm_eval/data/gsm8k serves where the full set is absent, said on stderr), the
first `--requests` in file order. Each is prompted as lm-eval prompts it:

- most with lm-eval's plain `gsm8k` 0-shot prompt, "Question: {question}\\nAnswer:", whose text the
  line carries (`prompt`) beside its count;
- `--few-shot` of them, chosen with `--seed`, with lm-eval's `gsm8k-cot` 8-shot prompt: its eight
  exemplars ("Q: ...\\nA: ...", from the installed lm-eval's gsm8k-cot.yaml) before the question.
  These share the exemplars: `prefix_id` "gsm8k-cot-8shot", `prefix_tokens` the tokens all their
  prompts have in common. Their text (3 KB each) is left out to keep the file small: `id` names
  the problem, and this script rebuilds it.

Counts use the model's tokenizer (`--tokenizer`, SmolLM2-135M's by default, `make smollm2`):
`input_tokens` is the prompt's tokens as the engine adds them (`tokenizer(prompt).input_ids`),
`output_tokens` the reference solution's tokens (GSM8K's worked answer, "#### N" included, no
special tokens) plus one for the end-of-sequence token that ends a generation. There are no
arrival times: real ones are not in the data; `qeval goodput` sends the trace at seeded Poisson
gaps at each rate (`serving.arrivals: poisson`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
FULL = ROOT / "tasks" / "lm_eval_full" / "data" / "gsm8k" / "test.jsonl"
FIXTURE = ROOT / "tasks" / "lm_eval" / "data" / "gsm8k" / "test.jsonl"
PREFIX_ID = "gsm8k-cot-8shot"


def cot_exemplars() -> str:
    """lm-eval's gsm8k-cot 8-shot block: each exemplar as its doc_to_text ("Q: ...\\nA:") then " " and
    its target, joined by its fewshot_delimiter ("\\n\\n"), ending with the delimiter."""
    import lm_eval

    spec = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k-cot.yaml").read_text())
    shots = spec["fewshot_config"]["samples"]
    return "".join(f"Q: {s['question']}\nA: {s['target']}\n\n" for s in shots)


def common_prefix(rows: list[list[int]]) -> int:
    """Tokens all of `rows` begin with."""
    n = min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != rows[0][i] for r in rows):
            return i
    return n


def build(docs: list[dict[str, Any]], tokenizer: Any, few_shot: int, seed: int) -> list[dict[str, Any]]:
    """The trace's lines, in the documents' order."""
    chosen = set(np.random.default_rng(seed).choice(len(docs), size=few_shot, replace=False).tolist())
    exemplars = cot_exemplars()
    lines: list[dict[str, Any]] = []
    shot_ids: list[list[int]] = []
    for i, doc in enumerate(docs):
        out = len(tokenizer(doc["answer"], add_special_tokens=False).input_ids) + 1
        if i in chosen:
            ids = tokenizer(f"{exemplars}Q: {doc['question']}\nA:").input_ids
            shot_ids.append(ids)
            lines.append(
                {"id": f"gsm8k-test-{i}", "input_tokens": len(ids), "output_tokens": out, "prefix_id": PREFIX_ID}
            )
        else:
            prompt = f"Question: {doc['question']}\nAnswer:"
            lines.append(
                {
                    "id": f"gsm8k-test-{i}",
                    "prompt": prompt,
                    "input_tokens": len(tokenizer(prompt).input_ids),
                    "output_tokens": out,
                }
            )
    shared = common_prefix(shot_ids) if shot_ids else 0
    for line in lines:
        if "prefix_id" in line:
            line["prefix_tokens"] = shared
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--tokenizer", default=str(ROOT / "models" / "smollm2-135m"))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--few-shot", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "configs" / "workloads" / "gsm8k.jsonl")
    args = parser.parse_args()
    data = args.data or (FULL if FULL.is_file() else FIXTURE)
    if data == FIXTURE:
        print(f"{FULL} is absent (`make lm-eval-full`): using the {FIXTURE} fixture", file=sys.stderr)
    docs = [json.loads(line) for line in data.read_text().splitlines() if line.strip()][: args.requests]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lines = build(docs, tokenizer, min(args.few_shot, len(docs)), args.seed)
    sys.path.insert(0, str(ROOT))
    from qeval.files.atomic import atomic_write_bytes

    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode())
    print(f"wrote {args.out}: {len(lines)} requests from {data}, counted with {args.tokenizer}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
