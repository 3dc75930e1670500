"""Under a chat template, qeval's lm-eval route builds lm-eval's prompts byte for byte and scores
them as lm-eval does: configs/smollm2-chat.yaml (SmolLM2-135M-Instruct, which ships a template;
float32; a system prompt; few-shot as multi-turn by default, as one turn by GSM8K's own key),
its tasks scored as the worker scores them (the lm_eval kind's session and scoring, in process:
a `qeval run` adds minutes of subprocesses on this CI, not checks), each document against
`simple_evaluate(..., apply_chat_template=True)` with lm-eval's own HFLM: the multiple-choice
task's log-likelihoods within 1e-4 nats, GSM8K's greedy text identical. Few documents: the point
is per-document equality, which a handful shows."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow
CONFIG = ROOT / "configs" / "smollm2-chat.yaml"


@pytest.fixture(scope="module")
def scored() -> tuple[Any, dict[str, Any], Any]:
    """The config, qeval's results per task (its baseline setup), and lm-eval's HFLM."""
    from lm_eval.models.huggingface import HFLM

    from qeval.backends.hf.backend import HFBackend
    from qeval.config import load_config
    from qeval.tasks.lm_eval.kind import _session
    from qeval.tasks.lm_eval.scoring import score_lm_eval

    cfg = load_config(CONFIG)
    assert (Path(cfg.model.path) / ".prepared").is_file(), "run `make smollm2` (make test does)"
    backend = HFBackend(cfg, cfg.baseline, "cpu")
    backend.load()
    session = _session(cfg)
    try:
        names = list(session.infos)
        assert all(session.infos[n].chat_template_sha256 for n in names)  # the template is in each resume key
        ours = score_lm_eval(backend, session, names, lambda k: None)
    finally:
        session.close()
    theirs = HFLM(
        pretrained=cfg.model.path,
        device="cpu",
        dtype="float32",
        batch_size=cfg.batch_size,
        max_length=cfg.model.max_context,
    )
    return cfg, ours, theirs


def _lm_eval(lm: Any, cfg: Any, entry: Any) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from qeval.tasks.lm_eval.yamls import materialize

    with tempfile.TemporaryDirectory() as tmp:
        folder = materialize([Path(p) for p in cfg.lm_eval.include_path], {}, Path(tmp) / "tasks")
        manager = TaskManager(include_defaults=False, include_path=str(folder))
        return simple_evaluate(
            model=lm,
            tasks=[entry.name],
            task_manager=manager,
            num_fewshot=entry.num_fewshot,
            fewshot_random_seed=cfg.lm_eval.fewshot_seed,
            log_samples=True,
            bootstrap_iters=0,
            samples={entry.name: list(range(entry.limit))},
            gen_kwargs={"max_gen_toks": entry.max_gen_toks} if entry.max_gen_toks else None,
            apply_chat_template=True,
            system_instruction=cfg.system_prompt,
            fewshot_as_multiturn=entry.fewshot_as_multiturn is not False,
            verbosity="ERROR",
        )


@pytest.mark.parametrize("task", ["arc_easy_local", "gsm8k_local"])
def test_prompts_and_scores_equal_lm_evals_under_the_chat_template(
    scored: tuple[Any, dict[str, Any], Any], task: str
) -> None:
    cfg, ours, lm = scored
    entry = next(t for t in cfg.lm_eval.tasks if t.name == task)
    multiturn = entry.fewshot_as_multiturn is not False
    theirs = _lm_eval(lm, cfg, entry)
    records = ours[task].records
    samples = {int(s["doc_id"]): s for s in theirs["samples"][task]}
    assert sorted(samples) == [r.doc_id for r in records] == list(range(entry.limit))
    for rec in records:
        s = samples[rec.doc_id]
        assert rec.prompt == s["arguments"][0][0]  # byte for byte
        assert rec.prompt.startswith(f"<|im_start|>system\n{cfg.system_prompt}<|im_end|>")
        assert rec.prompt.count("<|im_start|>user") == (entry.num_fewshot + 1 if multiturn else 1)
        if rec.loglikelihoods is not None:
            theirs_ll = [float(r[0][0]) for r in s["resps"]]
            assert max(abs(a - b) for a, b in zip(rec.loglikelihoods, theirs_ll, strict=True)) <= 1e-4
        else:
            assert rec.raw_output == s["resps"][0][0] and rec.raw_output.strip()
            assert 1 <= rec.generated_tokens <= entry.max_gen_toks
    compared = "acc" if entry.max_gen_toks is None else "exact_match,strict-match"
    assert ours[task].metrics[compared]["value"] == pytest.approx(
        theirs["results"][task][compared if "," in compared else f"{compared},none"], abs=1e-12
    )
