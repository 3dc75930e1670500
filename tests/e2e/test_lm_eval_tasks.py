"""lm-evaluation-harness's task library scored by qeval: agreement with lm-eval's own
`simple_evaluate` on the same model (float32) for every request type, on the shipped
character-level model and on SmolLM2-135M (BPE, no BOS added), on both backends; groups with
per-subtask and group scores; recovery and suites; the hub code path on a local dataset folder."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import MODEL, ROOT, TASKS, run_cli, seq_plan

pytestmark = pytest.mark.slow
SMOLLM2 = ROOT / "models" / "smollm2-135m"
#: one task of each request type: multiple choice (acc, acc_norm), generation with lm-eval's
#: strict and flexible filters, rolling perplexity
TASK_SET = "hellaswag_local,gsm8k_local,wikitext_local"


def _tolerance(loglikelihood: float) -> float:
    """1e-4 nats, or 4 float32 ulps of the document's log-likelihood where that is coarser: a
    5,000-nat document's float32 ulp is 4.9e-4, and lm-eval sums it in float32."""
    return max(1e-4, 4 * float(np.spacing(np.float32(abs(loglikelihood)))))


def _bench(python: str, model: Path, tmp: Path, *extra: str, tasks: str = TASK_SET) -> list[dict]:
    out = tmp / "bench.json"
    res = subprocess.run(
        [
            python,
            str(ROOT / "bench" / "compare_lm_eval.py"),
            "--model",
            str(model),
            "--tasks",
            tasks,
            "--limit",
            "5",
            "--max-gen-toks",
            "24",
            "--json",
            str(out),
            "--threads",
            os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())["tasks"]


def _assert_agreement(
    rows: list[dict], types: frozenset[str] = frozenset({"multiple_choice", "generate_until", "loglikelihood_rolling"})
) -> None:
    assert {r["output_type"] for r in rows} == types
    for r in rows:
        assert r["n"] == 5, r
        assert r["generations_equal"] and r["per_document_metrics_equal"], r
        assert r["max_abs_diff"] <= _tolerance(r["max_abs_loglikelihood"]), r
        for metric, value in r["qeval"].items():
            if "perplexity" in metric:
                # exp(mean NLL): the documents' own 1e-4-nat tolerance, in the exponent (word perplexity
                # 8.4e19 = e^45.9 moved by 3e-6 relative between the two sides' float32 sums on 2 threads)
                assert math.log(r["lm_eval"][metric]) == pytest.approx(math.log(value), abs=1e-4), (r["task"], metric)
            else:
                assert r["lm_eval"][metric] == pytest.approx(value, rel=1e-6, abs=1e-9), (r["task"], metric)


def test_agreement_on_the_full_public_sets(tmp_path: Path) -> None:
    """On the real data (`make lm-eval-full`), SmolLM2: qeval's per-document log-likelihoods,
    generations and metric values equal lm-eval's simple_evaluate's, on a multiple-choice set of
    each shape (ARC-Challenge, HellaSwag), a generation task with its filters (GSM8K, chain of
    thought) and a log-likelihood task (LAMBADA)."""
    full = ROOT / "tasks" / "lm_eval_full"
    assert (full / ".prepared").is_file(), "run `make lm-eval-full` (make test does)"
    assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
    rows = _bench(
        sys.executable,
        SMOLLM2,
        tmp_path,
        "--include",
        str(full),
        tasks="arc_challenge_full,hellaswag_full,gsm8k_cot_full,lambada_openai_full",
    )
    _assert_agreement(rows, frozenset({"multiple_choice", "generate_until", "loglikelihood"}))


def test_hf_backend_agrees_with_simple_evaluate(tmp_path: Path) -> None:
    """The shipped character-level model on the three request types. SmolLM2's BPE is checked on
    the full sets above (multiple choice, generation, log-likelihood) and, with rolling perplexity,
    on the vLLM engine below; the same three local tasks on SmolLM2 here took 34-46 s of CI's
    time for no path of its own."""
    _assert_agreement(_bench(sys.executable, MODEL, tmp_path))


def test_vllm_backend_agrees_with_simple_evaluate(tmp_path: Path) -> None:
    """Both on the vLLM engine (lm-eval's `vllm` model type in .venv-vllm, where `make vllm`
    installs lm-eval), on the real BPE model."""
    from qeval.backends.vllm.install import worker_python
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.setups import Setup

    python = worker_python(
        RunConfig(name="b", model=ModelSpec(path="m"), backend="vllm", setups=[Setup(name="s")], tasks=["t"])
    )
    _assert_agreement(_bench(python, SMOLLM2, tmp_path, "--backend", "vllm"))


def _keys() -> dict:
    """The group run's config, as helpers.make_config takes it: three setups, lm-eval tasks of
    each kind (a group, acc_norm, rolling perplexity), a drop gate and a recovery gate."""
    from tests.helpers import INT8

    lm_eval = {
        "include_path": [TASKS / "lm_eval"],
        "tasks": [
            {"name": "mmlu_local", "num_fewshot": 1},
            {"name": "arc_easy_local", "num_fewshot": 1, "metric": "acc_norm"},
            {"name": "wikitext_local"},
        ],
        "suites": [],
    }
    return dict(
        name="lm",
        model={"dtype": "float32"},
        setups=[{"name": "fp32", "baseline": True}, INT8, {"name": "kv2", "kv_cache": "int2"}],
        tasks=None,
        performance=None,
        lm_eval=lm_eval,
        limit=8,
        budget={"gpu_memory_gib": 0.01, "context_len": 256, "overhead_gib": 0.001},
        gates=[{"task": "all", "max_drop": 0.5}, {"task": "mmlu_local", "min_recovery": 0.5}],
    )


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    from tests.helpers import make_config

    tmp = tmp_path_factory.mktemp("lm")
    cfg = make_config(tmp, **_keys())
    out = tmp / "out"
    res = run_cli("run", str(cfg), "--output", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), cfg


def test_a_group_reports_subtasks_group_and_paired_statistics(group_run: tuple[Path, dict, Path]) -> None:
    out, r, _ = group_run
    subjects = [
        "mmlu_local_abstract_algebra",
        "mmlu_local_college_computer_science",
        "mmlu_local_high_school_geography",
    ]
    assert r["groups"] == {"mmlu_local": subjects}
    assert r["tasks"]["mmlu_local"]["kind"] == "group" and r["tasks"]["mmlu_local"]["n"] == 24
    assert all(r["tasks"][s]["entry"] == "mmlu_local" and r["tasks"][s]["num_fewshot"] == 1 for s in subjects)
    for s in r["setups"]:
        scores = {t: s["tasks"][t]["metrics"]["acc"]["value"] for t in subjects}
        group = s["tasks"]["mmlu_local"]["metrics"]["acc"]["value"]
        assert group == pytest.approx(sum(scores.values()) / 3)  # equal sizes: the size-weighted mean
        if s["baseline"]:
            continue
        g = s["vs_baseline"]["mmlu_local"]
        assert g["n"] == 24 and g["ci_method"] == "newcombe" and g["ci"][0] <= g["delta"] <= g["ci"][1]
        assert g["verdict"] in ("pass", "fail", "inconclusive") and g["gate"]["min_recovery"] == 0.5
        base = next(b for b in r["setups"] if b["baseline"])["tasks"]["mmlu_local"]["metrics"]["acc"]["value"]
        if base:
            assert g["recovery"] == pytest.approx(group / base)
        for t in subjects:  # members: compared, not gated by `all`
            assert s["vs_baseline"][t]["n"] == 8 and s["vs_baseline"][t]["verdict"] is None
    arc = next(s for s in r["setups"] if s["name"] == "kv2")["vs_baseline"]["arc_easy_local"]
    assert arc["metric"] == "acc_norm"
    wiki = next(s for s in r["setups"] if s["name"] == "kv2")["vs_baseline"]["wikitext_local"]
    assert wiki["metric"] == "bits_per_byte" and wiki["kl"] > 0  # the int2 KV cache moved the distribution
    # and on the scored tokens of every choice of the multiple-choice tasks: the token-level distribution
    assert arc["kl"] > 0 and arc["kl_distribution"]["tokens"] >= 8 and arc["kl_distribution"]["kl_max"] >= arc["kl"]
    kv2 = next(s for s in r["setups"] if s["name"] == "kv2")
    for task in ("arc_easy_local", "mmlu_local_abstract_algebra"):  # over every token of every choice
        records = [json.loads(x) for x in (out / "samples" / "kv2" / f"{task}.jsonl").read_text().splitlines()]
        assert kv2["vs_baseline"][task]["kl_distribution"]["tokens"] == sum(sum(r["n_tokens"]) for r in records)
        assert all(r["kl_tokens"] == sum(r["n_tokens"]) for r in records)
    md = (out / "report.md").read_text()
    assert "## lm-eval group members" in md and "mmlu_local acc" in md


def test_records_carry_lm_evals_doc_ids_and_metric_values(group_run: tuple[Path, dict, Path]) -> None:
    out, _, _ = group_run
    rec = json.loads((out / "samples" / "int8" / "arc_easy_local.jsonl").read_text().splitlines()[3])
    assert rec["doc_id"] == 3 and rec["sample_id"] == "3"
    assert set(rec["metrics"]) == {"acc", "acc_norm"} and len(rec["loglikelihoods"]) == len(rec["n_tokens"])
    assert rec["prompt_hash"] and rec["doc_hash"]


def test_rerun_resumes_and_few_shot_changes_recompute(group_run: tuple[Path, dict, Path]) -> None:
    from tests.helpers import make_config

    out, _, cfg = group_run
    res = run_cli("run", str(cfg), "--output", str(out))
    assert res.returncode == 0 and res.stderr.count("skipped") == 3, res.stderr[-2000:]
    keys = _keys()
    keys["lm_eval"]["tasks"][1]["num_fewshot"] = 0  # arc_easy_local
    changed = make_config(cfg.parent, filename="c2.yaml", **keys)
    res = run_cli("run", str(changed), "--output", str(out), "--setups", "int8")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "int8: 1 lm-eval tasks" in res.stderr  # only arc: its few-shot setting is in its key
    r = json.loads((out / "results.json").read_text())
    assert r["tasks"]["arc_easy_local"]["num_fewshot"] == 0


def test_a_suite_reports_recovery(tmp_path: Path) -> None:
    from tests.helpers import make_config

    keys = _keys() | {"limit": 4}
    keys["lm_eval"] |= {"suites": ["openllm-v1-local"]}
    keys["lm_eval"]["tasks"][0] = {"name": "gsm8k_local", "num_fewshot": 1, "max_gen_toks": 16}  # was mmlu_local
    keys["gates"][1] = {"task": "openllm-v1-local", "min_recovery": 0.5}
    cfg = make_config(tmp_path, **keys)
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"), "--setups", "kv2")
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    suite = next(s for s in r["setups"] if s["name"] == "kv2")["suites"]["openllm-v1-local"]
    assert len(suite["tasks"]) == 6 and suite["verdict"] in ("pass", "fail", "inconclusive")
    if suite["baseline"]:
        assert suite["recovery"] == pytest.approx(suite["score"] / suite["baseline"])
        assert suite["ci"][0] <= suite["recovery"] <= suite["ci"][1]
    assert "## Suites" in (tmp_path / "out" / "report.md").read_text()


def test_the_hub_code_path_on_a_local_dataset_folder(tmp_path: Path) -> None:
    """A built-in lm-eval task (hellaswag) whose dataset_path names a folder, as a hub id would
    name a repository: lm-eval's own YAML, prompt and process_docs, data from `datasets`."""
    folder = tmp_path / "hellaswag-dataset"
    folder.mkdir()
    for split in ("train", "validation"):
        shutil.copy(TASKS / "lm_eval" / "data" / "hellaswag" / f"{split}.jsonl", folder / f"{split}.jsonl")
    from tests.helpers import make_config

    cfg = make_config(
        tmp_path,
        name="hub",
        model={"path": MODEL, "dtype": "float32"},
        tasks_dir=None,
        batch_size=None,
        setups=[{"name": "fp32", "baseline": True}],
        tasks=None,
        gates=None,
        performance=None,
        limit=4,
        lm_eval={"tasks": [{"name": "hellaswag", "num_fewshot": 1, "dataset_path": folder}]},
    )
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    assert r["tasks"]["hellaswag"]["kind"] == "lm_eval" and r["setups"][0]["tasks"]["hellaswag"]["n"] == 4
    rec = json.loads((tmp_path / "out" / "samples" / "fp32" / "hellaswag.jsonl").read_text().splitlines()[0])
    assert "[" not in rec["prompt"]  # hellaswag's process_docs ran: the WikiHow "[title]" markup is gone
    assert not math.isnan(r["setups"][0]["tasks"]["hellaswag"]["metrics"]["acc_norm"]["value"])


def test_the_smollm2_sweep_config_runs_and_reports_recovery(tmp_path: Path) -> None:
    """configs/smollm2-openllm.yaml (the real model, the offline Open LLM suite, WikiText), cut
    to 1 document a task (2 took 101 s of CI's time) and the baseline plus INT4 weights (the mixed
    INT4-weights + INT4-KV setup took 140 s of CI's time here against the baseline's 43: its
    quantized cache is the tiny model's demo's and test_longctx_e2e's SmolLM2 check's to exercise)."""
    assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
    out = tmp_path / "out"
    res = run_cli(
        "run",
        str(ROOT / "configs" / "smollm2-openllm.yaml"),
        "--output",
        str(out),
        "--limit",
        "1",
        "--setups",
        "int4",
        timeout=3000,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    int4 = next(s for s in r["setups"] if s["name"] == "int4")
    assert set(int4["suites"]) == {"openllm-v1-local"}
    assert int4["vs_baseline"]["wikitext_local"]["kl"] > 0
    md = (out / "report.md").read_text()
    assert "## Suites" in md and "openllm-v1-local" in md and "recovery" in md


def test_a_sequential_run_stops_decided_cells_and_reports_where(tmp_path: Path) -> None:
    """Issue 42 end to end on the shipped model (float32): the group run's config with the
    `sequential:` switch on and ARC-Easy's 24 documents. The cell on ARC (not in a group, acc_norm,
    the 0.5-point `all` gate) is decided sequentially: a setup stops scoring it at the look its
    sequence decides, its stored records are that prefix of the seeded order, and results.json, the
    report ("decided after N of 24 documents"), the trajectory plot and load_run() say so. The
    group is a cell too, decided on its pooled documents: its three
    subjects are drawn from one seeded order over the 24 and all stop at the group's look. WikiText
    (bits per byte) is judged by the fixed-n interval and named as such. A rerun takes up every
    stored task, the stopped ones included."""
    from qeval.analysis.sequential_run import group_ids
    from qeval.notebook import load_run
    from tests.helpers import make_config

    keys = _keys()
    keys["lm_eval"]["tasks"][1]["limit"] = 24  # arc_easy_local: the whole fixture, room for a look to decide
    keys["sequential"] = {"enabled": True, "min_docs": 8, "chunk_docs": 4, "seed": 1}
    # the group on the 0.5-point drop too: its recovery gate (a ratio to the baseline's near-chance
    # score) is far from decided on 24 documents
    keys["gates"] = [{"task": "all", "max_drop": 0.5}]
    cfg = make_config(tmp_path, **keys)
    out = tmp_path / "out"
    res = run_cli("run", str(cfg), "--output", str(out), "--setups", "int8")  # one cell: CI's minutes
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    seq = r["sequential"]
    assert sorted(c["task"] for c in seq["cells"]) == ["arc_easy_local", "mmlu_local"]
    assert seq["cell_level"] == pytest.approx(0.05 / 4)  # split over the config's cells, not this invocation's
    assert set(seq["not_sequential"]) == {"wikitext_local"}
    md = (out / "report.md").read_text()
    subjects = r["groups"]["mmlu_local"]

    def stored(setup: str, task: str) -> list[dict]:
        return [json.loads(x) for x in (out / "samples" / setup / f"{task}.jsonl").read_text().splitlines()]

    decided = 0
    for c in seq["cells"]:
        setup = next(s for s in r["setups"] if s["name"] == c["setup"])
        task = c["task"]
        if task == "mmlu_local":  # the group's members pooled: a prefix of the group's one order
            records = [x | {"sample_id": f"{m}/{x['sample_id']}"} for m in subjects for x in stored(c["setup"], m)]
            plan = seq_plan(seed=1, groups={"mmlu_local": [(m, 8) for m in subjects]})
            prefix = group_ids(plan, "mmlu_local")[: len(records)]
            assert sorted(x["sample_id"] for x in records) == sorted(prefix)
            assert all(setup["tasks"][m]["n"] < 8 for m in subjects) or len(records) == 24
        else:
            records = stored(c["setup"], task)
        assert c["documents"] == len(records) == setup["tasks"][task]["n"] and c["total"] == 24
        assert [k["n"] for k in c["looks"]] == list(range(4, len(records) + 1, 4)) + (
            [len(records)] if len(records) % 4 else []
        )
        vs = setup["vs_baseline"][task]
        assert vs["verdict"] == c["verdict"] and vs["n"] == len(records)
        if c["stopped_at"] is not None:  # stopped at its deciding look, not before the floor
            decided += 1
            assert c["stopped_at"] == len(c["looks"]) - 1 and c["looks"][-1]["n"] >= 8
            assert c["verdict"] != "inconclusive" and all(k["verdict"] == "inconclusive" for k in c["looks"][:-1])
            where = f"decided after {len(records)} of 24"
            assert where in md and where in vs["verdict_reason"]
        else:  # not decided: scored to the cap
            assert len(records) == 24 and c["verdict"] == "inconclusive"
            assert "not decided after 24 of 24" in md
    base = next(s for s in r["setups"] if s["baseline"])
    # pass 1's horizon (4 x the first look at the floor, 8) is past the cap: the baseline scores to it, in one pass
    assert base["tasks"]["arc_easy_local"]["n"] == 24 == base["tasks"]["mmlu_local"]["n"]
    assert "sequential pass 2" not in res.stderr
    # the group cell a pass unit too, its documents pooled
    assert seq["baseline"] == {t: {"documents": 24, "total": 24} for t in ("arc_easy_local", "mmlu_local")}
    assert "sequential pass 1: horizon 24 documents; 1 setup still undecided" in res.stderr
    assert "arc_easy_local: baseline: 24 of 24 documents" in md
    # int8 on this model changes next to no answer: far inside a 0.5-point gate, both cells stop early
    assert decided == 2 and seq["documents"] < seq["total"]
    assert "## Sequential gates" in md and "Judged by the fixed-n interval at the end" in md
    saved = 1 - seq["documents"] / seq["total"]
    assert f"of the {seq['total']:,} documents a fixed run scores" in md and f"{saved:.0%} of the scoring saved" in md
    html = (out / "report.html").read_text()
    assert "Sequential gate trajectory: arc_easy_local" in html and "<svg" in html
    frame = load_run(out).sequential()
    assert len(frame) == sum(len(c["looks"]) for c in seq["cells"])

    again = run_cli("run", str(cfg), "--output", str(out), "--setups", "int8")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("skipped") == 2 and "lm-eval tasks" not in again.stderr  # nothing scored again
    assert json.loads((out / "results.json").read_text())["sequential"] == seq
