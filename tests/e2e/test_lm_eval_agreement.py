"""qeval's log-likelihoods against lm-evaluation-harness's on the same model, float32, lm-eval's
default arguments: on the shipped model (character-level, its tokenizer adds BOS) and on
SmolLM2-135M (byte-level BPE, no BOS added), where a first-token convention bug once cost 13 nats
per document."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tests.helpers import MODEL, ROOT

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from qeval.backends.hf.backend import HFBackend

pytestmark = pytest.mark.slow
SMOLLM2 = ROOT / "models" / "smollm2-135m"
ENGLISH = [
    "The river rose through the night, and by morning the lower fields were under water. Farmers "
    "moved their animals to the hill behind the church and waited for the rain to stop.",
    "A good recipe lists its ingredients in the order they are used.",
    "Quantization stores each weight in fewer bits, which saves memory at some cost in accuracy.",
    " Leading spaces and\nnew lines are part of the text too.",
]
noop = lambda n: None  # noqa: E731


def _pair(model: Path, max_length: int) -> tuple[HFBackend, HFLM]:
    from lm_eval.models.huggingface import HFLM

    from qeval.backends.hf.backend import HFBackend
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.setups import Setup

    setup = Setup(name="fp32")
    cfg = RunConfig(
        name="a",
        model=ModelSpec(path=str(model), dtype="float32", max_context=max_length),
        setups=[setup],
        tasks=["x"],
        batch_size=4,
    )
    ours = HFBackend(cfg, setup, "cpu")
    ours.load()
    theirs = HFLM(pretrained=str(model), device="cpu", dtype="float32", batch_size=4, max_length=max_length)
    return ours, theirs


def _instances(kind: str, args: Sequence[tuple[str, ...]]) -> list[Instance]:
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.mark.parametrize("which", ["shipped", "smollm2"])
def test_rolling_loglikelihood_matches_lm_eval_per_document(which: str) -> None:
    from qeval.backends.base import RollingRequest

    if which == "smollm2":
        assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
        model, texts, max_length = SMOLLM2, ENGLISH, 24  # several windows per document
    else:
        from qeval.tasks import load_task

        task = load_task("ppl", ROOT / "tasks", limit=12)
        model, texts, max_length = MODEL, [task.text(d) for d in task.docs], 48
    ours, theirs = _pair(model, max_length)
    got = np.array([r.logprob for r in ours.loglikelihood_rolling([RollingRequest(t) for t in texts], noop)])
    ref = np.array(theirs.loglikelihood_rolling(_instances("loglikelihood_rolling", [(t,) for t in texts])))
    np.testing.assert_allclose(got, ref, atol=1e-3, rtol=0)
    if which == "smollm2":  # the first token of each document is scored (it used to be skipped)
        n_tokens = [r.n_tokens for r in ours.loglikelihood_rolling([RollingRequest(t) for t in texts], noop)]
        assert n_tokens == [len(ours.tok(t).input_ids) for t in texts]


@pytest.mark.parametrize("which", ["shipped", "smollm2"])
def test_choice_loglikelihoods_match_lm_eval(which: str) -> None:
    from qeval.backends.base import LoglikelihoodRequest

    model = SMOLLM2 if which == "smollm2" else MODEL
    pairs = [
        ("The capital of France is", " Paris"),
        ("The capital of France is", " Rome"),
        ("2 + 2 =", " 4"),
        ("", "Hello world"),
        ("Trailing space ", "moves"),
    ]
    ours, theirs = _pair(model, 64)
    got = np.array([r.logprob for r in ours.loglikelihood([LoglikelihoodRequest(c, x) for c, x in pairs], noop)])
    ref = np.array([ll for ll, _ in theirs.loglikelihood(_instances("loglikelihood", pairs))])
    np.testing.assert_allclose(got, ref, atol=1e-3, rtol=0)
