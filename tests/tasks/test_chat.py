"""Chat templates and reasoning blocks, without a model: the keys merge task over run, a
template is chosen as lm-eval chooses it (or refused in one line), native prompts are the
tokenizer's own rendering, no double BOS, the resume key changes with the template, a config
without the keys hashes as before, and `think_end_token` strips as lm-eval strips."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qeval.config import ModelSpec, RunConfig
from qeval.config.chat import ChatKeys, merge_chat, merge_think_end, strip_thinking
from qeval.config.lm_eval import LmEvalSpec, LmEvalTask
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.tasks.chat import ChatResolver, select_template, task_chat
from tests.helpers import MODEL, ROOT, TASKS

SMOLLM2 = ROOT / "models" / "smollm2-135m"


def _cfg(**keys: Any) -> RunConfig:
    return RunConfig(
        name="t",
        model=ModelSpec(path=str(SMOLLM2)),
        setups=[Setup(name="b")],
        tasks=["addition"],
        tasks_dir=str(TASKS),
        **keys,
    )


def test_task_keys_override_the_runs_and_multiturn_needs_a_template() -> None:
    run = ChatKeys(chat_template=True, system_prompt="S")
    assert merge_chat(run) == merge_chat(run, ChatKeys())
    assert merge_chat(run).fewshot_as_multiturn is True  # simple_evaluate's default under a template
    own = merge_chat(run, ChatKeys(chat_template=False))
    assert not own.on and own.system_prompt == "S" and own.fewshot_as_multiturn is False
    assert merge_chat(run, ChatKeys(fewshot_as_multiturn=False)).fewshot_as_multiturn is False
    assert merge_chat(ChatKeys()).plain
    with pytest.raises(UserError, match=r"^lm-eval task x: fewshot_as_multiturn: true needs a chat template"):
        task_chat(
            ChatResolver(ModelSpec(path=str(SMOLLM2))), ChatKeys(fewshot_as_multiturn=True), None, "lm-eval task x"
        )
    assert merge_think_end(ChatKeys(think_end_token="</think>")) == "</think>"
    assert merge_think_end(ChatKeys(think_end_token="</think>"), ChatKeys(think_end_token="<|end|>")) == "<|end|>"


def test_a_template_is_chosen_as_lm_eval_chooses_it_or_refused_in_one_line() -> None:
    many = SimpleNamespace(chat_template={"default": "D", "tool_use": "T"})
    assert select_template(many, True, "t") == ("D", "default")
    assert select_template(many, "tool_use", "t") == ("T", "tool_use")
    with pytest.raises(
        UserError,
        match=r"^t: chat_template: the tokenizer has no template 'rag' \(it has: default, "
        r"tool_use\)$",
    ):
        select_template(many, "rag", "t")
    assert select_template(SimpleNamespace(chat_template="ONE"), True, "t") == ("ONE", None)
    with pytest.raises(UserError, match="carries one unnamed template; use chat_template: true"):
        select_template(SimpleNamespace(chat_template="ONE"), "tool_use", "t")
    with pytest.raises(UserError, match="the model's tokenizer carries no chat template"):
        select_template(SimpleNamespace(chat_template=None), True, "t")


def test_a_template_name_is_a_name() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        LmEvalTask(name="x", chat_template="../../etc/passwd")


def test_native_prompts_are_the_tokenizers_rendering_and_choices_follow_without_a_delimiter() -> None:
    from transformers import AutoTokenizer

    from qeval.tasks.native.kind import _load

    cfg = _cfg(chat_template=True, system_prompt="Be brief.", think_end_token="</think>")
    addition, ppl = _load(cfg, ["addition"]) + _load(cfg.model_copy(update={"tasks": ["ppl"]}), ["ppl"])
    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    doc = addition.docs[0]
    expected = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": addition.text(doc)}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert addition.prompt(doc) == expected and expected.endswith("<|im_start|>assistant\n")
    assert addition.choice_delimiter == "" and addition.think_end_token == "</think>"
    assert addition.chat_template_sha256 is not None
    assert ppl.chat is None and ppl.think_end_token is None  # a perplexity text is scored as it is
    plain = _load(_cfg(system_prompt="Be brief."), ["addition"])[0]
    assert plain.prompt(doc) == "Be brief.\n\n" + plain.text(doc)  # no template: lm-eval's plain system text
    assert plain.choice_delimiter == plain.spec.target_delimiter


def test_the_resume_key_carries_the_templates_hash_and_a_plain_task_none() -> None:
    from qeval.records.keys import _chat_part
    from qeval.tasks.native.kind import _load

    plain = _load(_cfg(), ["addition"])[0]
    assert _chat_part(plain) == {}
    keys = {
        s: _chat_part(_load(_cfg(chat_template=True, system_prompt=s), ["addition"])[0])["chat_template"]
        for s in ("A", "B")
    }
    assert keys["A"] != keys["B"] and len(keys["A"]) == 64
    again = _load(_cfg(chat_template=True, system_prompt="A"), ["addition"])[0]
    assert _chat_part(again) == {"chat_template": keys["A"]}
    thinking = _load(_cfg(think_end_token="</think>"), ["addition"])[0]
    assert _chat_part(thinking) == {"think_end_token": "</think>"}


def test_a_config_without_the_keys_reads_and_hashes_as_before() -> None:
    spec = LmEvalSpec(tasks=[LmEvalTask(name="arc_easy_local")])
    cfg = RunConfig(name="t", model=ModelSpec(path=str(MODEL)), setups=[Setup(name="b")], lm_eval=spec)
    body = cfg.as_json()
    for key in ("chat_template", "system_prompt", "fewshot_as_multiturn", "think_end_token"):
        assert key not in body and key not in body["lm_eval"]["tasks"][0]
    on = cfg.model_copy(update={"chat_template": True})
    assert on.as_json()["chat_template"] is True and on.config_hash() != cfg.config_hash()


def test_no_double_bos_when_the_text_brings_its_own() -> None:
    """The shipped tokenizer prepends BOS `<s>`: a chat-rendered text that starts with it is
    encoded without another (HFLM.tok_encode's has_bos_prefix), plain text gets one."""
    from transformers import AutoTokenizer

    from qeval.backends.tokens import conventions

    tok = AutoTokenizer.from_pretrained(MODEL)
    conv = conventions(tok)
    bos = tok.bos_token_id
    assert conv.encode("12+3=")[0] == bos and conv.encode("12+3=").count(bos) == 1
    assert conv.encode("<s>12+3=") == conv.encode("12+3=")
    assert conv.prompt("<s>12+3=") == conv.encode("12+3=") == conv.prompt("12+3=")


@pytest.mark.parametrize("text", ["<think>a\n\nb</think>\n\n42", "no block 7", "</think>x</think> y", ""])
def test_the_reasoning_block_is_stripped_as_lm_eval_strips_it(text: str) -> None:
    from lm_eval.models.utils import postprocess_generated_text

    assert strip_thinking(text, "</think>") == postprocess_generated_text(text, None, "</think>")
    assert strip_thinking(text, None) == text


def test_chat_keys_are_refused_on_a_gguf_model(tmp_path: Path) -> None:
    from qeval.tasks.chat import load_tokenizer

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(UserError, match="is a GGUF file"):
        load_tokenizer(ModelSpec(path=str(gguf)))


def test_a_native_generation_is_scored_after_its_reasoning_block_and_counted_whole() -> None:
    """The shipped model on `addition`: with `think_end_token` set to a string its answers
    contain, each is scored on what follows the token, while `raw_output` and the generated
    token count stay those of the plain run."""
    from qeval.backends.hf.backend import HFBackend
    from qeval.tasks.native.kind import _load
    from qeval.tasks.scoring import score_task

    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(MODEL), dtype="float32", max_context=256),
        setups=[Setup(name="b")],
        tasks=["addition"],
        tasks_dir=str(TASKS),
        limit=4,
    )
    backend = HFBackend(cfg, cfg.setups[0], "cpu")
    backend.load()
    plain = score_task(backend, _load(cfg, ["addition"])[0], lambda n: None).records
    assert all(1 <= (r.generated_tokens or 0) <= 6 for r in plain)  # max_gen_toks: 6
    marker = next(ch for r in plain for ch in r.raw_output or "" if not ch.isspace())
    thinking = _load(cfg.model_copy(update={"think_end_token": marker}), ["addition"])[0]
    records = score_task(backend, thinking, lambda n: None).records
    for p, r in zip(plain, records, strict=True):
        assert (r.raw_output, r.generated_tokens) == (p.raw_output, p.generated_tokens)
        scored = strip_thinking(r.raw_output or "", marker)
        assert (r.raw_output if r.response is None else r.response) == scored and r.prediction == scored.strip()
    assert any(r.response is not None for r in records)
