"""Bad input ends in one clear line on stderr and exit code 2, before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli, write_config

GOOD = """\
name: t
model: {path: "@MODEL@"}
tasks_dir: "@TASKS@"
device: cpu
setups:
  - {name: bf16, baseline: true}
  - {name: int4, weights: int4, group_size: 128}
  - {name: kv2, kv_cache: int2}
tasks: [addition, ppl]
"""

BAD = {
    "malformed_yaml": (GOOD.replace("tasks: [addition, ppl]", "tasks: [addition, ppl"), "invalid YAML"),
    "duplicate_key": (GOOD + "device: cpu\n", "duplicate key 'device'"),
    "unknown_key": (GOOD + "batchsize: 3\n", "batchsize: unknown key"),
    "unknown_task": (GOOD.replace("[addition, ppl]", "[addition, trivia]"), "unknown task 'trivia'"),
    "missing_model": (GOOD.replace('"@MODEL@"', '"./no/such/model"'), "model path ./no/such/model not found"),
    "vllm_only_fp8_weights": (
        GOOD.replace("weights: int4, group_size: 128", "weights: fp8"),
        "fp8 weights quantized on the fly and fp8_e5m2 KV are served by the vllm backend",
    ),
    "torchao_int4_on_cpu": (GOOD.replace("group_size: 128", "method: torchao"), "offers int8 weights, not int4"),
    "cuda_without_gpu": (GOOD.replace("device: cpu", "device: cuda"), "no NVIDIA GPU"),
    "bad_kv_value": (GOOD.replace("kv_cache: int2", "kv_cache: int3"), "setups.2.kv_cache"),
    "duplicate_setup": (GOOD.replace("name: kv2", "name: int4"), "duplicate setup names: int4"),
    "gate_on_unknown_task": (GOOD + "gates: [{task: facts, max_drop: 0.01}]\n", "gate names task 'facts'"),
    "archived_autogptq": (
        GOOD.replace("weights: int4, group_size: 128", "weights: int4, method: AutoGPTQ"),
        "AutoGPTQ is archived upstream",
    ),
    "calibration_twice": (
        GOOD + "quantize: {calibration: {path: a.jsonl, dataset: org/name}}\n",
        "give calibration `path` or `dataset`, not both",
    ),
    "group_size_on_int8": (
        GOOD.replace("weights: int4, group_size", "weights: int8, group_size"),
        "group_size applies to int4",
    ),
    # issue 40: numbers too large for what consumes them are refused at validation (point 14, minor)
    "seed_past_numpy": (GOOD + "seed: 99999999999999999999\n", "seed: Input should be less than or equal to"),
    "seed_negative": (GOOD + "seed: -1\n", "seed: Input should be greater than or equal to 0"),
    "fewshot_seed_huge": (GOOD + "lm_eval: {fewshot_seed: 4294967296}\n", "lm_eval.fewshot_seed"),
    "huge_integer": (GOOD + "batch_size: " + "9" * 400 + "\n", "batch_size: an integer of 400 digits is too large"),
    "huge_integer_in_a_setup": (
        GOOD.replace("kv_cache: int2", "kv_cache: int2, memory_limit_mib: 1" + "0" * 30),
        "memory_limit_mib: an integer of 31 digits is too large",
    ),
    # keep patterns that keep nothing or everything (point 12): vLLM refuses the first already
    "keep_matches_nothing": (
        GOOD.replace("group_size: 128}", "group_size: 128, keep: [nomatch.*]}"),
        "no keep pattern matches a linear layer of this model",
    ),
    "keep_everything": (
        GOOD.replace("group_size: 128}", "group_size: 128, keep: ['*']}"),
        "keep matches every linear layer of this model (28): nothing would be quantized",
    ),
}


def test_good_config_validates(tmp_path: Path) -> None:
    res = run_cli("validate", str(write_config(tmp_path / "c.yaml", GOOD)))
    assert res.returncode == 0, res.stderr
    assert "ok (3 setups, 2 tasks, device cpu, dtype " in res.stdout


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    body, expected = BAD[case]
    res = run_cli("validate", str(write_config(tmp_path / "c.yaml", body)))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert expected in lines[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("option", ["--setups", "--tasks"])
@pytest.mark.parametrize("value", ["", " , "])
def test_an_empty_selection_is_refused(tmp_path: Path, option: str, value: str) -> None:
    """`--setups ""` ran every setup (an empty string read as no option): it names nothing."""
    res = run_cli("run", str(write_config(tmp_path / "c.yaml", GOOD)), option, value, "--output", str(tmp_path / "out"))
    assert res.returncode == 2 and f"{option} {value!r}: names nothing" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_run_refuses_bad_config_before_loading(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", BAD["unknown_task"][0])
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"))
    assert res.returncode == 2 and "unknown task" in res.stderr
    assert not (tmp_path / "out").exists()


def test_corrupt_dataset_line_via_cli(tmp_path: Path) -> None:
    import shutil

    from tests.helpers import TASKS

    tasks = tmp_path / "tasks"
    (tasks / "data").mkdir(parents=True)
    shutil.copy(TASKS / "addition.yaml", tasks)
    shutil.copy(TASKS / "ppl.yaml", tasks)
    shutil.copy(TASKS / "data" / "ppl.jsonl", tasks / "data")
    (tasks / "data" / "addition.jsonl").write_text('{"a": 1, "b": 2, "answer": "3", "id": "x"}\n{"a": 1,\n')
    text = (tasks / "addition.yaml").read_text()
    (tasks / "addition.yaml").write_text("\n".join(x for x in text.splitlines() if "dataset_sha256" not in x))
    cfg = write_config(tmp_path / "c.yaml", GOOD.replace('"@TASKS@"', f'"{tasks}"'))
    res = run_cli("validate", str(cfg))
    assert res.returncode == 2
    assert "addition.jsonl:2: corrupt dataset line" in res.stderr


def test_trust_remote_code_is_off_by_default(tmp_path: Path) -> None:
    from qeval.config import load_config

    assert load_config(write_config(tmp_path / "c.yaml", GOOD)).model.trust_remote_code is False


LM = GOOD.replace(
    "tasks: [addition, ppl]",
    'tasks: [addition]\nlm_eval: {include_path: ["@TASKS@/lm_eval"], tasks: [{name: arc_easy_local}]}',
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (LM.replace("tasks: [{name: arc_easy_local}]", "suites: [openllm-v9]"), "unknown suite 'openllm-v9'"),
        (LM + "gates: [{task: all, max_drop: 0.01, min_recovery: 0.99}]\n", "max_drop or min_recovery"),
        (
            LM.replace("{name: arc_easy_local}", "{name: arc_easy_local, metric: f1}"),
            "metric 'f1' is not one it reports",
        ),
        (
            LM.replace("{name: arc_easy_local}", "{name: gsm8k_local}").replace(
                '"@MODEL@"}', '"@MODEL@", max_context: 256}'
            ),
            "leaves no room for the prompt",
        ),
        (
            LM.replace("tasks: [addition]\n", "tasks: []\n").replace("tasks: [{name: arc_easy_local}]", "tasks: []"),
            "no task to score",
        ),
        (LM.replace("{name: arc_easy_local}", "{name: arc_easy_local}, {name: arc_easy_local}"), "listed twice"),
        (LM + "gates: [{task: mmlu_nope, max_drop: 0.01}]\n", "gate names task 'mmlu_nope'"),
    ],
)
def test_bad_lm_eval_input_is_one_line_exit_2(tmp_path: Path, body: str, expected: str) -> None:
    res = run_cli("validate", str(write_config(tmp_path / "c.yaml", body)))
    assert res.returncode == 2, (res.stdout, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.stderr[-2000:]


def test_lm_eval_tasks_validate(tmp_path: Path) -> None:
    res = run_cli("validate", str(write_config(tmp_path / "c.yaml", LM)))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "(3 setups, 2 tasks" in res.stdout


@pytest.mark.slow
def test_an_unknown_lm_eval_task_is_one_line(tmp_path: Path) -> None:
    """Not in the include path: lm-eval's own library is searched (its index takes seconds)."""
    res = run_cli("validate", str(write_config(tmp_path / "c.yaml", LM.replace("arc_easy_local", "arc_eazy"))))
    assert res.returncode == 2 and "unknown lm-eval task 'arc_eazy'" in res.stderr, res.stderr[-2000:]
