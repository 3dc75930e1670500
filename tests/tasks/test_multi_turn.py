"""The multi-turn kind (qeval/tasks/multi_turn) and the gates written at a turn or a generated
position: conversations generated under a chat template (the tiny model with a one-line template
added to its folder; SmolLM2's own where its folder is), seeded, checksummed, deeper turns
farther from the facts; a model without a template is one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qeval.config import ModelSpec, RunConfig
from qeval.config.gates import Gate
from qeval.config.generation import GenerationDivergenceSpec
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.results.generation import GeneratedPositionBucket
from qeval.tasks.generation.results import judged
from qeval.tasks.multi_turn.spec import MultiTurnSpec
from qeval.tasks.multi_turn.tasks import build_tasks, resolve_gates

#: a short template: the tiny model reads 256 characters, one token each
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a: {% endif %}"
)
SMOLLM2 = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m"


@pytest.fixture(scope="module")
def templated(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's folder with a chat template added (the weights are the shipped ones)."""
    out = tmp_path_factory.mktemp("tiny-chat") / "qeval-tiny-chat"
    shutil.copytree(model_path, out)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


def _cfg(path: Path, spec: dict, max_context: int = 256, **extra: object) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "t",
            "model": {"path": str(path), "max_context": max_context},
            "setups": [{"name": "a"}],
            "kinds": {"multi_turn": spec},
        }
        | extra
    )


SMALL = {"turns": [2, 3, 4], "samples": 5, "filler_words": 0, "system_prompt": "", "max_gen_toks": 4}


def test_conversations_are_seeded_checksummed_and_deeper_turns_farther(templated: Path) -> None:
    cfg = _cfg(templated, SMALL)
    spec = MultiTurnSpec.model_validate(SMALL)
    tasks = build_tasks(cfg, spec)
    again = build_tasks(cfg, spec)
    other = build_tasks(cfg, spec.model_copy(update={"seed": 7}))
    assert [t.name for t in tasks] == ["multi_turn_t2", "multi_turn_t3", "multi_turn_t4"]
    assert [t.sha256 for t in tasks] == [t.sha256 for t in again] and [t.docs for t in tasks] == [t.docs for t in again]
    assert all(a.sha256 != b.sha256 for a, b in zip(tasks, other, strict=True))
    gaps = [sum(d["gap_tokens"] for d in t.docs) / len(t.docs) for t in tasks]
    assert gaps[0] == 0 and gaps[0] < gaps[1] < gaps[2]
    for t in tasks:
        for d in t.docs:
            text = d["text"]
            assert text.count("u: ") == t.turn and text.endswith("a: ")  # the question is user turn `turn`
            assert f"number is {d['answer']}." in text and len(text) + 4 <= 256
    limited = build_tasks(cfg.model_copy(update={"limit": 2}), spec)
    assert len(limited[0].docs) == 2 and limited[0].sha256 == tasks[0].sha256  # the checksum covers all


def test_a_model_without_a_chat_template_is_one_line(model_path: Path) -> None:
    with pytest.raises(UserError, match="carries no chat template"):
        build_tasks(_cfg(model_path, SMALL), MultiTurnSpec.model_validate(SMALL))


def test_too_long_for_the_context_is_one_line(templated: Path) -> None:
    spec = SMALL | {"turns": [2, 12], "filler_words": 30}
    with pytest.raises(UserError, match="more than model.max_context 256"):
        build_tasks(_cfg(templated, spec), MultiTurnSpec.model_validate(spec))


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").is_file(), reason="models/smollm2-135m is not prepared")
def test_smollm2_template_renders_the_conversation() -> None:
    spec = {"turns": [2, 6], "samples": 2}
    tasks = build_tasks(_cfg(SMOLLM2, spec, 2048), MultiTurnSpec.model_validate(spec))
    text = tasks[1].docs[0]["text"]
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant")
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>user") == 6 and tasks[1].docs[0]["gap_tokens"] > 200


def test_spec_refuses_bad_turns() -> None:
    for bad in ({"turns": [1, 2]}, {"turns": [4, 2]}, {"chat_template": False}):
        with pytest.raises(ValueError):
            MultiTurnSpec.model_validate(bad)


def test_turn_gates_become_gates_on_the_turn_task() -> None:
    spec = MultiTurnSpec.model_validate(SMALL)
    gates = [Gate(task="multi_turn", turn=3, max_drop=0.02), Gate(task="all", max_drop=0.05)]
    assert [(g.task, g.turn) for g in resolve_gates(gates, spec)] == [("multi_turn_t3", 3), ("all", None)]
    for bad, why in (
        ([Gate(task="multi_turn", turn=5, max_drop=0.02)], "not one of"),
        ([Gate(task="addition", turn=3, max_drop=0.02)], "its task must be"),
    ):
        with pytest.raises(UserError, match=why):
            resolve_gates(bad, spec)
    with pytest.raises(UserError, match="no kinds.multi_turn"):
        resolve_gates([Gate(task="multi_turn", turn=3, max_drop=0.02)], None)


def test_gate_keys_stay_out_of_the_config_while_unset(model_path: Path) -> None:
    plain = RunConfig(
        name="t",
        model=ModelSpec(path=str(model_path)),
        setups=[Setup(name="a")],
        tasks=["x"],
        gates=[Gate(task="x", max_drop=0.02)],
    )
    assert plain.as_json()["gates"] == [
        {"task": "x", "max_drop": 0.02, "relative": False, "min_recovery": None, "length": None}
    ]
    with pytest.raises(ValueError, match="at most one of"):
        Gate(task="x", max_drop=0.1, turn=2, position=0)
    with pytest.raises(ValueError, match="takes max_drop"):
        Gate(task="x", min_recovery=0.9, position=0)
    assert GenerationDivergenceSpec(position_buckets=[0, 8]).position_buckets == [0, 8]
    with pytest.raises(ValueError, match="start at 0"):
        GenerationDivergenceSpec(position_buckets=[4, 8])


def _bucket(delta: float, ci: tuple[float, float], docs: int) -> GeneratedPositionBucket:
    return GeneratedPositionBucket(start=16, end=32, documents=docs, tokens=10 * docs, nll=1.0, delta=delta, ci=ci)


@pytest.mark.parametrize(
    ("ci", "docs", "expected"),
    [
        ((0.01, 0.04), 20, "pass"),
        ((0.06, 0.2), 20, "fail"),
        ((0.01, 0.09), 20, "inconclusive"),
        ((0.01, 0.02), 5, "inconclusive"),
    ],
)
def test_position_gate_verdicts(ci: tuple[float, float], docs: int, expected: str) -> None:
    out = judged(
        [_bucket(sum(ci) / 2, ci, docs), _bucket(0.0, (0.0, 0.0), docs).model_copy(update={"start": 0})], {16: 0.05}
    )
    assert out[0].verdict == expected and out[0].max_drop == 0.05
    assert (out[0].verdict_reason is not None) == (docs < 6)
    assert out[1].verdict is None  # no gate at position 0
