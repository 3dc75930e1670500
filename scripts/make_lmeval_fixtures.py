"""Offline fixtures in the schemas of lm-evaluation-harness's built-in tasks, from the items in
scripts/lmeval_items/<task>.yaml.

    .venv/bin/python scripts/make_lmeval_fixtures.py [--out DIR]   # rewrites tasks/lm_eval/data/<task>/<split>.jsonl

Every item is written for qeval (none is copied from a benchmark); the field names, types
and split names are those the built-in task YAMLs and their process_docs functions read
(lm-eval 0.4.13): hellaswag (Rowan/hellaswag), arc (allenai/ai2_arc), mmlu (cais/mmlu),
gsm8k (openai/gsm8k main), winogrande (winogrande_xl), wikitext
(EleutherAI/wikitext_document_level wikitext-2-raw-v1) and truthfulqa (multiple_choice).
Deterministic: no randomness, stable key order, one JSON object per line;
tests/tasks/test_lmeval_fixtures.py checks that the committed files are what this writes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
ITEMS = ROOT / "scripts" / "lmeval_items"
DATA = ROOT / "tasks" / "lm_eval" / "data"

Row = dict[str, Any]


def hellaswag_rows(items: list[Row], split: str) -> list[Row]:
    """The validation rows are numbered from 0 (split "val"), the train rows from 1000."""
    start, short = (0, "val") if split == "validation" else (1000, "train")
    return [
        {
            "ind": start + i,
            "activity_label": it["activity_label"],
            "ctx_a": it["ctx_a"],
            "ctx_b": it["ctx_b"],
            "ctx": f"{it['ctx_a']} {it['ctx_b']}",
            "endings": it["endings"],
            "source_id": f"{it['source']}~local_{start + i:04d}",
            "split": short,
            "split_type": "indomain" if i % 2 == 0 else "zeroshot",
            "label": str(it["label"]),
        }
        for i, it in enumerate(items)
    ]


def arc_rows(prefix: str) -> Callable[[list[Row], str], list[Row]]:
    def rows(items: list[Row], split: str) -> list[Row]:
        name = prefix + ("Train" if split == "train" else "")
        return [
            {
                "id": f"{name}_{i + 1:03d}",
                "question": it["question"],
                "choices": {
                    "text": it["choices"],
                    "label": ["1", "2", "3", "4"] if it["answer"].isdigit() else ["A", "B", "C", "D"],
                },
                "answerKey": it["answer"],
            }
            for i, it in enumerate(items)
        ]

    return rows


def gsm8k_rows(items: list[Row], split: str) -> list[Row]:
    return [{"question": it["question"], "answer": "\n".join(it["steps"]) + f"\n#### {it['answer']}"} for it in items]


def winogrande_rows(items: list[Row], split: str) -> list[Row]:
    return [{k: it[k] for k in ("sentence", "option1", "option2", "answer")} for it in items]


def page(item: Row) -> str:
    """One wikitext page: " = Title = ", then each section's heading and paragraphs, each " \\n"-separated."""
    out = [f" = {item['title']} = \n"]
    for section in item["sections"]:
        if section["heading"]:
            out.append(f" \n = = {section['heading']} = = \n")
        out += [f" \n {p} \n" for p in section["paragraphs"]]
    return "".join(out)


def wikitext_rows(items: list[Row], split: str) -> list[Row]:
    return [{"page": page(it)} for it in items]


def truthfulqa_rows(items: list[Row], split: str) -> list[Row]:
    """mc1: the best correct answer and the incorrect ones; mc2: all correct (label 1) then all
    incorrect (label 0), the real data's order."""
    return [
        {
            "question": it["question"],
            "mc1_targets": {
                "choices": [it["correct"][0], *it["incorrect"]],
                "labels": [1] + [0] * len(it["incorrect"]),
            },
            "mc2_targets": {
                "choices": it["correct"] + it["incorrect"],
                "labels": [1] * len(it["correct"]) + [0] * len(it["incorrect"]),
            },
        }
        for it in items
    ]


#: each items file's rows, by task folder
TASKS: dict[str, Callable[[list[Row], str], list[Row]]] = {
    "hellaswag": hellaswag_rows,
    "arc_easy": arc_rows("LocalArcEasy"),
    "arc_challenge": arc_rows("LocalArcChallenge"),
    "gsm8k": gsm8k_rows,
    "winogrande": winogrande_rows,
    "wikitext": wikitext_rows,
    "truthfulqa": truthfulqa_rows,
}


def files() -> dict[str, list[Row]]:
    """Every fixture file's rows, by its path under the data folder (`mmlu/<subject>/dev.jsonl`)."""
    out: dict[str, list[Row]] = {}
    for task, rows in TASKS.items():
        for split, items in yaml.safe_load((ITEMS / f"{task}.yaml").read_text(encoding="utf-8")).items():
            out[f"{task}/{split}.jsonl"] = rows(items, split)
    for subject, splits in yaml.safe_load((ITEMS / "mmlu.yaml").read_text(encoding="utf-8")).items():
        for split, items in splits.items():
            out[f"mmlu/{subject}/{split}.jsonl"] = [
                {"question": it["question"], "subject": subject, "choices": it["choices"], "answer": it["answer"]}
                for it in items
            ]
    return out


def render(rows: list[Row]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA, help="the data folder to write (default: %(default)s)")
    out = parser.parse_args().out
    for name, rows in files().items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(rows), encoding="utf-8")


if __name__ == "__main__":
    main()
