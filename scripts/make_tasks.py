"""Write qeval's shipped task suite: tasks/<task>.yaml and tasks/data/<task>.jsonl, and
tasks/data/train.jsonl, the suite's training text (the first documents of the stream the
tiny model was trained on), which `qeval quantize` calibrates on by default.

    python scripts/make_tasks.py

Deterministic (seeded, see tiny_corpus.py): rerunning rewrites identical files. Each
YAML records its data file's sha256; qeval refuses data that does not match.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_corpus as tc

ROOT = Path(__file__).resolve().parent.parent / "tasks"
N_TRAIN = 512  # calibration documents: llm-compressor's usual 512

TASKS = {
    "compare_mc": {
        "description": "Pick the largest or smallest of four two-digit numbers (4-way multiple choice).",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
    },
    "addition": {
        "description": "Two-digit addition, greedy generation, exact match.",
        "output_type": "generate_until",
        "doc_to_text": "{{a}} + {{b}} =",
        "doc_to_target": "answer",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6},
        "metric_list": [{"metric": "exact_match"}],
    },
    "facts": {
        "description": "Recall memorised ISO codes (countries: alpha-2, languages: ISO 639-3), greedy, exact match.",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "answer",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6},
        "metric_list": [{"metric": "exact_match"}],
    },
    "ppl": {
        "description": "Perplexity on held-out documents of the training distribution.",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "text",
        "metric_list": [{"metric": "bits_per_byte"}, {"metric": "token_perplexity"}],
    },
}


def documents() -> dict[str, list[dict]]:
    s = tc.make_splits()
    docs: dict[str, list[dict]] = {}
    docs["compare_mc"] = [
        {
            "id": f"cmp-{i:04d}",
            "question": tc.compare_text(w, n),
            "choices": [str(x) for x in n],
            "label": n.index(tc.compare_answer(w, n)),
        }
        for i, (w, n) in enumerate(s.compare_eval)
    ]
    docs["addition"] = [
        {"id": f"add-{i:04d}", "a": a, "b": b, "answer": str(a + b)} for i, (a, b) in enumerate(s.add_eval)
    ]
    docs["facts"] = [
        {"id": f"fact-{i:04d}", "kind": f.kind, "question": f.prompt, "answer": f.code}
        for i, f in enumerate(s.fact_eval)
    ]
    docs["ppl"] = [{"id": f"ppl-{i:04d}", "text": t} for i, t in enumerate(tc.perplexity_documents(s))]
    return docs


def main() -> None:
    import yaml

    (ROOT / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in documents().items():
        data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
        (ROOT / "data" / f"{name}.jsonl").write_bytes(data)
        spec = {
            "task": name,
            **TASKS[name],
            "dataset_path": "json",
            "data_files": f"data/{name}.jsonl",
            "test_split": "test",
            "dataset_sha256": hashlib.sha256(data).hexdigest(),
            "metadata": {"generator": "scripts/make_tasks.py", "seed": tc.SEED, "n": len(rows)},
        }
        (ROOT / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
        print(f"{name}: {len(rows)} samples")
    train = itertools.islice(tc.training_documents(tc.make_splits()), N_TRAIN)
    data = "".join(json.dumps({"id": f"train-{i:04d}", "text": t}, sort_keys=True) + "\n" for i, t in enumerate(train))
    (ROOT / "data" / "train.jsonl").write_text(data)
    print(f"train (calibration text): {N_TRAIN} documents")


if __name__ == "__main__":
    main()
