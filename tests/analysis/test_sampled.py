"""Sampled generation: intervals paired by document and clustered over repeats; seeded,
reproducible decoding on transformers; a sampled task with 3 seeds through a whole run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qeval.analysis.comparison import compare, paired_records
from qeval.analysis.stats import naive_interval, paired_clustered
from qeval.results.samples import SampleRecord
from tests.helpers import TASKS, make_config, run_cli, sample_records


def _width(ci: tuple[float, float]) -> float:
    return ci[1] - ci[0]


def _draws(rng: np.random.Generator, p: np.ndarray, k: int) -> np.ndarray:
    return (rng.random((len(p), k)) < p[:, None]).astype(float)


def test_clustered_interval_is_wider_on_correlated_repeats_and_equal_on_independent_ones() -> None:
    rng = np.random.default_rng(7)
    n, k = 400, 3
    # correlated: a document is easy or hard for both setups and all its repeats (p near 0 or 1);
    # the setup flips some documents' difficulty, so the per-document differences vary
    difficulty = rng.choice([0.03, 0.97], n)
    other_p = np.where(rng.random(n) < 0.15, 1 - difficulty, difficulty)
    base, other = _draws(rng, difficulty, k), _draws(rng, other_p, k)
    clustered = paired_clustered(base, other, "exact_match", 0).ci
    naive = naive_interval(base, other)
    assert _width(clustered) > 1.4 * _width(naive), (clustered, naive)
    # independent: every (document, repeat) draw has the same chance, no document effect
    base, other = _draws(rng, np.full(n, 0.6), k), _draws(rng, np.full(n, 0.6), k)
    clustered = paired_clustered(base, other, "exact_match", 0).ci
    naive = naive_interval(base, other)
    assert _width(clustered) == pytest.approx(_width(naive), rel=0.08), (clustered, naive)
    # the point estimate is the mean over repeats either way
    assert paired_clustered(base, other, "exact_match", 0).delta == pytest.approx(float((other - base).mean()))


def _sampled_records(correct: np.ndarray) -> list[SampleRecord]:
    return sample_records(
        {
            "sample_id": str(i),
            "correct": float(row.mean()),
            "pass_at_k": bool(row.any()),
            "repeats": [{"seed": s, "raw_output": "", "prediction": "", "correct": bool(c)} for s, c in enumerate(row)],
        }
        for i, row in enumerate(correct)
    )


def test_sampled_records_are_compared_clustered_by_document() -> None:
    rng = np.random.default_rng(3)
    p = rng.choice([0.05, 0.95], 200)  # correlated: documents flip between easy and hard as a whole
    base, other = _draws(rng, p, 3), _draws(rng, np.where(rng.random(200) < 0.2, 1 - p, p), 3)
    data = paired_records(_sampled_records(base), _sampled_records(other), "exact_match")
    assert data is not None and data.repeats is not None
    cmp = compare(data, "t", 0, [])
    assert cmp.ci_method == "t_clustered" and cmp.repeats == 3 and cmp.n == 200
    assert cmp.ci == pytest.approx(paired_clustered(base, other, "exact_match", 0).ci)
    assert _width(cmp.ci) > _width(naive_interval(base, other))
    # pass@k is one right/wrong value per document: Newcombe's interval, no repeats
    pk = paired_records(_sampled_records(base), _sampled_records(other), "pass_at_k")
    assert pk is not None and pk.repeats is None and compare(pk, "t", 0, []).ci_method == "newcombe"


def test_seeded_sampling_on_transformers_is_reproducible() -> None:
    """Same seed, same text, whatever the batch holds besides (one generator per row); other
    seeds draw other texts. On the tiny float32 model no batch shape flips a draw."""
    from qeval.backends.base import GenerateRequest, Sampling
    from qeval.backends.hf.backend import HFBackend
    from qeval.config import load_config

    cfg = load_config(make_config(Path(__import__("tempfile").mkdtemp()), model={"dtype": "float32"}))
    backend = HFBackend(cfg, cfg.setups[0], "cpu")
    backend.load()
    prompts = [f"{a} + {b} =" for a, b in [(12, 34), (7, 8), (55, 66), (90, 9)]]

    def run(seeds: list[int], order: list[int]) -> dict[tuple[int, int], str]:
        reqs = [(i, s) for s in seeds for i in order]
        outs = backend.generate(
            [GenerateRequest(prompts[i], ("\n",), 6, Sampling(2.0, 0.95, 40, s)) for i, s in reqs], lambda n: None
        )
        return dict(zip(reqs, outs, strict=True))

    first = run([0, 1, 2], [0, 1, 2, 3])
    assert run([0, 1, 2], [0, 1, 2, 3]) == first  # a rerun
    alone = run([1], [2])
    assert alone[(2, 1)] == first[(2, 1)]  # decoded alone, in a batch of one
    shuffled = run([2, 0], [3, 1, 0, 2])
    assert all(shuffled[key] == first[key] for key in shuffled)
    assert len({first[(i, s)] for i in range(4) for s in range(3)}) > 4  # seeds matter: texts differ
    greedy = backend.generate([GenerateRequest(prompts[0], ("\n",), 8)], lambda n: None)
    assert greedy == backend.generate([GenerateRequest(prompts[0], ("\n",), 8)], lambda n: None)


SAMPLED_TASK = """\
task: addition_sampled
output_type: generate_until
doc_to_text: '{{a}} + {{b}} ='
doc_to_target: answer
generation_kwargs: {until: ["\\n"], max_gen_toks: 6, do_sample: true, temperature: 1.5, top_k: 20, top_p: 0.95}
repeats: 3
seeds: [11, 12, 13]
metric_list: [{metric: exact_match}, {metric: pass_at_k}, {metric: maj_at_k}]
dataset_path: json
data_files: data/addition.jsonl
"""


def test_a_sampled_task_with_three_seeds_reports_clustered_intervals(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    (tasks / "data").mkdir(parents=True)
    (tasks / "addition_sampled.yaml").write_text(SAMPLED_TASK)
    (tasks / "data" / "addition.jsonl").write_bytes((TASKS / "data" / "addition.jsonl").read_bytes())
    cfg = make_config(
        tmp_path,
        tasks_dir=str(tasks),
        tasks=["addition_sampled"],
        gates=None,
        setups=[{"name": "bf16", "baseline": True}, {"name": "int8", "weights": "int8"}],
    )
    out = tmp_path / "out"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "24")
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    int8 = next(s for s in results["setups"] if s["name"] == "int8")
    cmp = int8["vs_baseline"]["addition_sampled"]
    assert cmp["ci_method"] == "t_clustered" and cmp["repeats"] == 3 and cmp["n"] == 24
    assert set(int8["tasks"]["addition_sampled"]["metrics"]) == {"exact_match", "pass_at_k", "maj_at_k"}
    rows = [json.loads(line) for line in (out / "samples" / "int8" / "addition_sampled.jsonl").read_text().splitlines()]
    base = [json.loads(line) for line in (out / "samples" / "bf16" / "addition_sampled.jsonl").read_text().splitlines()]
    assert all([r["seed"] for r in row["repeats"]] == [11, 12, 13] for row in rows)
    k = np.array([[r["correct"] for r in row["repeats"]] for row in rows], dtype=float)
    kb = np.array([[r["correct"] for r in row["repeats"]] for row in base], dtype=float)
    # the score is the mean over repeats; the interval the clustered one, not the k x n one
    assert int8["tasks"]["addition_sampled"]["metrics"]["exact_match"]["value"] == pytest.approx(k.mean())
    assert cmp["ci"] == pytest.approx(list(paired_clustered(kb, k, "exact_match", 0).ci))
    assert any(len({r["raw_output"] for r in row["repeats"]}) > 1 for row in base)  # really sampled
    assert "clustered by document over the repeats" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    ("yaml_extra", "needle"),
    [
        ("repeats: 3\n", "repeats 3 needs sampling"),
        ("generation_kwargs: {temperature: 0.7}\n", "temperature needs do_sample: true"),
        (
            "generation_kwargs: {do_sample: true, temperature: 0.7}\nrepeats: 2\nseeds: [1]\n",
            "seeds: 1 given for repeats 2",
        ),
        ("metric_list: [{metric: pass_at_k}]\n", "pass_at_k needs repeats of 2 or more"),
        # the tiny model's generation_config.json has no sampling keys: nothing to read from its card
        ("generation_kwargs: {do_sample: true, from_model_card: true}\nrepeats: 2\n", "sets none of temperature"),
    ],
)
def test_bad_sampling_keys_are_one_line(tmp_path: Path, yaml_extra: str, needle: str) -> None:
    from qeval.config import load_config
    from qeval.errors import UserError
    from qeval.run.preflight import preflight

    tasks = tmp_path / "tasks"
    (tasks / "data").mkdir(parents=True)
    head = SAMPLED_TASK.split("generation_kwargs")[0]
    (tasks / "s.yaml").write_text(head.replace("addition_sampled", "s") + yaml_extra + "data_files: data/a.jsonl\n")
    (tasks / "data" / "a.jsonl").write_text('{"a": 1, "b": 2, "answer": "3"}\n')
    with pytest.raises(UserError) as err:  # what `qeval validate` prints, exit 2
        preflight(load_config(make_config(tmp_path, tasks_dir=str(tasks), tasks=["s"])))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_from_model_card_fills_what_the_task_leaves_unset() -> None:
    from qeval.tasks.native.tasks import TaskSpec
    from qeval.tasks.sampling import repeat_sampling

    spec = TaskSpec.model_validate(
        {
            "task": "t",
            "output_type": "generate_until",
            "doc_to_text": "x",
            "repeats": 3,
            "generation_kwargs": {"do_sample": True, "from_model_card": True, "top_k": 5},
        }
    )
    plans = repeat_sampling(spec, {"temperature": 0.6, "top_p": 0.95, "top_k": 20})
    assert [(p.temperature, p.top_p, p.top_k, p.seed) for p in plans if p] == [(0.6, 0.95, 5, s) for s in range(3)]
