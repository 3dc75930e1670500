"""Under a chat template, qeval's lm-eval route builds lm-eval's prompts byte for byte and scores
them as lm-eval does: SmolLM2-135M-Instruct (it ships a template), float32, against
`simple_evaluate(..., apply_chat_template=True)` with lm-eval's own HFLM, on a multiple-choice
task (log-likelihoods within 1e-4 nats) and on GSM8K (greedy: the same text), with a system
prompt, few-shot as multi-turn and as one turn. Few documents: the point is per-document
equality, which a handful shows."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow
SMOLLM2 = ROOT / "models" / "smollm2-135m"
SYSTEM = "You are a careful grader. Answer briefly."
#: task, shots, documents, max_gen_toks, few-shot as multi-turn
CASES = [("arc_easy_local", 2, 3, None, True), ("gsm8k_local", 1, 2, 32, False)]


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
    from lm_eval.models.huggingface import HFLM

    from qeval.backends.hf.backend import HFBackend
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.setups import Setup

    setup = Setup(name="fp32")
    cfg = RunConfig(name="a", model=ModelSpec(path=str(SMOLLM2), dtype="float32", max_context=1024),
                    setups=[setup], tasks=["x"], batch_size=8)
    ours = HFBackend(cfg, setup, "cpu")
    ours.load()
    return ours, HFLM(pretrained=str(SMOLLM2), device="cpu", dtype="float32", batch_size=8, max_length=1024)


def _lm_eval(lm: Any, task: str, shots: int, n: int, max_gen: int | None, multiturn: bool) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from qeval.tasks.lm_eval.yamls import materialize

    with tempfile.TemporaryDirectory() as tmp:
        folder = materialize([ROOT / "tasks" / "lm_eval"], {}, Path(tmp) / "tasks")
        manager = TaskManager(include_defaults=False, include_path=str(folder))
        return simple_evaluate(model=lm, tasks=[task], task_manager=manager, num_fewshot=shots,
                               fewshot_random_seed=1234, log_samples=True, bootstrap_iters=0,
                               samples={task: list(range(n))},
                               gen_kwargs={"max_gen_toks": max_gen} if max_gen else None,
                               apply_chat_template=True, system_instruction=SYSTEM, fewshot_as_multiturn=multiturn,
                               verbosity="ERROR")


def _qeval(backend: Any, task: str, shots: int, n: int, max_gen: int | None, multiturn: bool) -> Any:
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.lm_eval import LmEvalSpec, LmEvalTask
    from qeval.config.setups import Setup
    from qeval.tasks.lm_eval.kind import chat_for
    from qeval.tasks.lm_eval.scoring import score_lm_eval
    from qeval.tasks.lm_eval.session import open_session

    # the run's keys set the template; the task's own override the few-shot layout
    entry = LmEvalTask(name=task, num_fewshot=shots, max_gen_toks=max_gen, fewshot_as_multiturn=multiturn)
    spec = LmEvalSpec(include_path=[str(ROOT / "tasks" / "lm_eval")], fewshot_seed=1234, tasks=[entry])
    cfg = RunConfig(name="a", model=ModelSpec(path=str(SMOLLM2), dtype="float32"), setups=[Setup(name="b")],
                    lm_eval=spec, chat_template=True, system_prompt=SYSTEM)
    session = open_session(spec, ROOT, n, chat_for(cfg))
    try:
        assert session.infos[task].chat_template_sha256  # the template enters the task's resume key
        return score_lm_eval(backend, session, [task], lambda k: None)[task]
    finally:
        session.close()


@pytest.mark.parametrize(("task", "shots", "n", "max_gen", "multiturn"), CASES)
def test_prompts_and_scores_equal_lm_evals_under_the_chat_template(models: tuple[Any, Any], task: str, shots: int,
                                                                  n: int, max_gen: int | None,
                                                                  multiturn: bool) -> None:
    ours_backend, lm = models
    theirs = _lm_eval(lm, task, shots, n, max_gen, multiturn)
    ours = _qeval(ours_backend, task, shots, n, max_gen, multiturn)
    samples = {int(s["doc_id"]): s for s in theirs["samples"][task]}
    assert sorted(samples) == [r["doc_id"] for r in ours.records] == list(range(n))
    for rec in ours.records:
        s = samples[rec["doc_id"]]
        assert rec["prompt"] == s["arguments"][0][0]  # byte for byte
        assert rec["prompt"].startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>")
        assert rec["prompt"].count("<|im_start|>user") == (shots + 1 if multiturn else 1)
        if rec["loglikelihoods"] is not None:
            theirs_ll = [float(r[0][0]) for r in s["resps"]]
            assert max(abs(a - b) for a, b in zip(rec["loglikelihoods"], theirs_ll, strict=True)) <= 1e-4
        else:
            assert rec["raw_output"] == s["resps"][0][0] and rec["raw_output"].strip()
    compared = "acc" if max_gen is None else "exact_match,strict-match"
    theirs_value = theirs["results"][task][compared if "," in compared else f"{compared},none"]
    assert ours.metrics[compared]["value"] == pytest.approx(theirs_value, abs=1e-12)
