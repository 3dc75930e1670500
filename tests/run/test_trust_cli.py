"""The command line refuses bad input in one line and exit code 2, before any model loads:
`qeval plan`'s model files and options, rich markup in what qeval prints, lax config types,
ambiguous names, Typer's usage errors, and a run directory inside the model's folder."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from qeval.config import load_config
from qeval.errors import UserError
from qeval.sweep.config import load_sweep
from tests.helpers import MODEL, ROOT, TASKS, run_cli, write_config

LLAMA2 = ROOT / "tests" / "data" / "llama2-7b-config.json"


def _one_line_exit_2(res: subprocess.CompletedProcess[str], expected: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("qeval: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in res.stderr


def _plan_rows(*args: str) -> dict[str, dict]:
    res = run_cli("plan", *args, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    return {r["setup"]: r for r in json.loads(res.stdout)["setups"]}


# --- qeval plan: model files and options (point 9) ---------------------------------------------


def _tiny_gguf(path: Path) -> Path:
    """A llama GGUF carrying the shape of models/qeval-tiny (its metadata is all plan reads)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(128)
    writer.add_block_count(4)
    writer.add_feed_forward_length(384)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_vocab_size(128)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tensor("token_embd.weight", np.zeros((128, 128), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_plan_reads_a_gguf_file_as_run_does(tmp_path: Path) -> None:
    """`plan --model x.gguf` reads the config the GGUF describes (qeval/model/source.py), as
    `run` does, instead of decoding the binary file as JSON (point 9)."""
    fp16 = _plan_rows("--model", str(_tiny_gguf(tmp_path / "tiny.gguf")))["fp16"]
    assert fp16["kv_bytes_per_token"] == 2 * 4 * 2 * 32 * 2  # K and V x layers x KV heads x head_dim x 2 bytes


def test_plan_on_a_file_that_is_not_gguf_is_one_line(tmp_path: Path) -> None:
    """A corrupt or non-GGUF `.gguf` file: one line naming it, not a UnicodeDecodeError (point 9)."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    _one_line_exit_2(run_cli("plan", "--model", str(bad)), "broken.gguf")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not a readable JSON config"),
        ("[1, 2]", "not a JSON object"),
        ('"a string"', "not a JSON object"),
        ("{}", "lacks 'num_attention_heads'"),
        (json.dumps(json.loads(LLAMA2.read_text()) | {"num_attention_heads": 0}), "num_attention_heads 0"),
        (json.dumps(json.loads(LLAMA2.read_text()) | {"hidden_size": "4096"}), "hidden_size '4096'"),
        (json.dumps({"text_config": [1]}), "not a JSON object"),
    ],
)
def test_plan_on_a_bad_config_json_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    """A config.json that is not JSON, not an object, lacks fields or has a zero head count (point 9)."""
    (tmp_path / "config.json").write_text(text)
    _one_line_exit_2(run_cli("plan", "--model", str(tmp_path / "config.json")), expected)
    _one_line_exit_2(run_cli("plan", "--model", str(tmp_path)), expected)  # the folder holding it


def test_validate_refuses_zero_attention_heads(tmp_path: Path) -> None:
    """A model folder whose config.json has num_attention_heads 0: one line, not a ZeroDivisionError (point 9)."""
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"num_attention_heads": 0, "head_dim": None}))
    from tests.helpers import make_config

    _one_line_exit_2(run_cli("validate", str(make_config(tmp_path, model=model))), "num_attention_heads 0")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--gpu-gib", "inf"),
        ("--gpu-gib", "nan"),
        ("--gpu-gib", "-1"),
        ("--utilization", "nan"),
        ("--overhead-gib", "inf"),
        ("--margin", "nan"),
    ],
)
def test_plan_refuses_a_budget_that_is_not_a_finite_number(option: str, value: str) -> None:
    """inf and nan passed click's ranges and crashed the capacity formula (point 9)."""
    _one_line_exit_2(run_cli("plan", "--model", str(LLAMA2), option, value), option)


# --- rich markup in what qeval prints (point 10) ------------------------------------------------


def test_the_summary_table_prints_an_error_with_markup_as_written() -> None:
    """A setup's error containing `[/x]` ended `qeval run` in a MarkupError; `[red]` vanished (point 10)."""
    from rich.console import Console

    from qeval.report.markdown import print_summary
    from qeval.results.schema import read_results

    results = read_results(ROOT / "tests" / "data" / "run-v1" / "results.json")
    failed = results.setups[-1].model_copy(update={"status": "failed", "error": "OSError [/x] in m[red]"})
    results = results.model_copy(update={"setups": [*results.setups[:-1], failed]})
    out = io.StringIO()
    print_summary(results, Console(file=out, width=200))
    assert "OSError [/x] in m[red]" in out.getvalue()


@pytest.mark.parametrize("folder", ["m[/x]", "m[red]"])
def test_plan_prints_a_model_path_with_brackets_as_written(tmp_path: Path, folder: str) -> None:
    """`m[/x]` crashed plan's table title; `m[red]` was shown as `m` (point 10)."""
    (tmp_path / folder).mkdir(parents=True)
    shutil.copy(LLAMA2, tmp_path / folder / "config.json")
    res = run_cli("plan", "--model", folder, "--gpus-per-node", "2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count(f"{folder} on ") == 2, res.stdout  # the plan's table and the cluster view's


def test_tasks_prints_a_folder_with_brackets_as_written(tmp_path: Path) -> None:
    """`qeval tasks` prints the include folder as written (point 10)."""
    (tmp_path / "f[red]").mkdir()
    (tmp_path / "f[red]" / "x.yaml").write_text("task: x_local\n")
    res = run_cli("tasks", "--lm-eval", "f[red]", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "f[red]" in res.stdout, res.stdout


# --- strict types, ambiguous names (point 12) ----------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"batch_size": True}, "batch_size: Input should be a valid integer"),
        ({"limit": "5"}, "limit: Input should be a valid integer"),
        ({"performance": {"enabled": "yes"}}, "performance.enabled: Input should be a valid boolean"),
        ({"lm_eval": {"tasks": [{"name": "arc_challenge_local", "num_fewshot": True}]}}, "lm_eval.tasks.0.num_fewshot"),
        ({"model": {"trust_remote_code": 1}}, "model.trust_remote_code"),
        ({"budget": {"gpu_memory_gib": "24"}}, "budget.gpu_memory_gib: Input should be a valid number"),
    ],
)
def test_config_values_of_another_type_are_refused(tmp_path: Path, keys: dict, expected: str) -> None:
    """`batch_size: true` was read as 1, `limit: "5"` as 5, `enabled: "yes"` as true (point 12)."""
    from tests.helpers import make_config

    with pytest.raises(UserError, match=expected) as exc:
        load_config(make_config(tmp_path, **keys))
    assert "\n" not in str(exc.value)


def test_a_setup_value_of_another_type_is_refused(tmp_path: Path) -> None:
    """Setups are as strict as the rest of the config (point 12)."""
    from tests.helpers import BASELINE, INT8, make_config

    cfg = make_config(tmp_path, setups=[BASELINE, INT8 | {"optional": "yes"}])
    with pytest.raises(UserError, match="setups.1.optional: Input should be a valid boolean"):
        load_config(cfg)


def test_a_budget_of_inf_in_a_config_is_refused(tmp_path: Path) -> None:
    """`.inf` or `.nan` in YAML is no budget (point 12, as for plan's options)."""
    from tests.helpers import make_config

    cfg = make_config(tmp_path)
    write_config(cfg, cfg.read_text() + "budget: {gpu_memory_gib: .inf}\n")  # YAML's own spelling
    with pytest.raises(UserError, match="budget.gpu_memory_gib"):
        load_config(cfg)


def test_an_integer_is_still_a_number(tmp_path: Path) -> None:
    """Strict types keep `utilization: 1` a number (point 12)."""
    from tests.helpers import make_config

    cfg = load_config(make_config(tmp_path, budget={"utilization": 1, "gpu_memory_gib": 16}))
    assert cfg.budget.utilization == 1.0 and cfg.budget.gpu_memory_gib == 16.0


def test_two_include_folders_defining_one_task_are_refused(tmp_path: Path) -> None:
    """lm-eval scored the first folder's task and ignored the other without a word (point 12)."""
    from qeval.tasks.lm_eval.yamls import materialize

    for folder in ("team_a", "team_b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.yaml").write_text("task: shared_task\ndataset_path: json\n")
    with pytest.raises(UserError, match="'shared_task' is defined in both") as exc:
        materialize([tmp_path / "team_a", tmp_path / "team_b"], {}, tmp_path / "out")
    assert str(tmp_path / "team_a") in str(exc.value) and str(tmp_path / "team_b") in str(exc.value)


def test_setup_names_differing_only_in_case_are_refused(tmp_path: Path) -> None:
    """`A` and `a` share a folder on a case-insensitive file system (point 12)."""
    from tests.helpers import BASELINE, INT8, make_config

    cfg = make_config(tmp_path, setups=[BASELINE, INT8 | {"name": "BF16"}])
    with pytest.raises(UserError, match="setup names bf16 and BF16 differ only in case"):
        load_config(cfg)


# --- typos and confusing errors (point 13) --------------------------------------------------------


SWEEP = f"""\
name: s
models:
  - {{name: a, path: "{MODEL}"}}
  - {{name: b, path: "{MODEL}"}}
tasks_dir: "{TASKS}"
device: cpu
setups: [{{name: bf16, baseline: true}}]
tasks: [addition]
"""


def test_sweep_model_names_differing_only_in_case_are_refused(tmp_path: Path) -> None:
    """Two sweep models `a` and `A` share a run folder on macOS or Windows (point 12)."""
    (tmp_path / "s.yaml").write_text(SWEEP.replace("{name: b,", "{name: A,"))
    with pytest.raises(UserError, match="model names a and A differ only in case"):
        load_sweep(tmp_path / "s.yaml")


@pytest.mark.parametrize(
    "extra",
    [
        {"lm_eval": {"include_path": [TASKS / "lm_eval"], "tasks": [{"name": "arc_challenge_local"}]}},
        {"long_context": {"lengths": [64], "tasks": ["passkey"]}},
    ],
)
def test_a_config_without_native_tasks_needs_no_tasks_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict
) -> None:
    """Only `lm_eval:` or `long_context:`: no `tasks` folder is read, so none is required (point 13)."""
    from tests.helpers import make_config

    monkeypatch.chdir(tmp_path)  # no tasks/ folder here, nor beside the config
    cfg = load_config(make_config(tmp_path, tasks_dir=None, tasks=None, **extra))
    assert cfg.tasks == []


def test_a_missing_tasks_dir_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error says which key names the missing folder (point 13)."""
    monkeypatch.chdir(tmp_path)
    from tests.helpers import make_config

    with pytest.raises(UserError, match="tasks_dir no-such: directory not found"):
        load_config(make_config(tmp_path, tasks_dir="no-such"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("run", "--limit", "abc", "c.yaml"), "'--limit'"),
        (("run", "--no-such-option", "c.yaml"), "No such option: --no-such-option"),
        (("run",), "Missing argument"),
        (("plan",), "--model"),
        (("no-such-command",), "No such command"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: tuple[str, ...], expected: str) -> None:
    """Typer drew a multi-line box for these, where every other bad input is one line (point 13)."""
    _one_line_exit_2(run_cli(*args), expected)


def test_help_still_works() -> None:
    """Usage errors are one line; --help is still Typer's help (point 13)."""
    res = run_cli("plan", "--help")
    assert res.returncode == 0 and "--gpus-per-node" in res.stdout, res.stderr[-3000:]


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        ("batchsize: 3\n", "s.yaml: batchsize: unknown key"),
        ("max_context: 64\n", "s.yaml: max_context: unknown key (a model's own setting"),
        ("batch_size: 0\n", "s.yaml: batch_size: Input should be greater than 0"),
    ],
)
def test_a_sweeps_own_keys_are_not_blamed_on_a_model(tmp_path: Path, top: str, expected: str) -> None:
    """A sweep's top-level key was reported as `models.<first>: key` (point 13)."""
    (tmp_path / "s.yaml").write_text(SWEEP + top)
    with pytest.raises(UserError) as exc:
        load_sweep(tmp_path / "s.yaml")
    assert expected in str(exc.value) and "models." not in str(exc.value), str(exc.value)


def test_a_models_own_key_is_still_blamed_on_it(tmp_path: Path) -> None:
    """An error in what a model gives itself still names the model (point 13)."""
    (tmp_path / "s.yaml").write_text(SWEEP.replace("{name: b,", "{name: b, candidate: nosuch,"))
    with pytest.raises(UserError, match="models.b: candidate 'nosuch' is not a setup"):
        load_sweep(tmp_path / "s.yaml")


@pytest.mark.parametrize("option", ["--nodes", "--concurrency"])
def test_cluster_options_without_gpus_per_node_are_refused(option: str) -> None:
    """They were ignored without a word: the plan printed had no cluster view (point 13)."""
    _one_line_exit_2(run_cli("plan", "--model", str(LLAMA2), option, "2"), f"{option} applies to the cluster view")


# --- the run directory (point 18) --------------------------------------------------------------------


def test_an_output_inside_the_model_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Its files would change the model's checksum: every rerun would recompute everything (point 18)."""
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    before = sorted(p.name for p in model.rglob("*"))
    from tests.helpers import make_config

    cfg = make_config(tmp_path, model=model)
    _one_line_exit_2(run_cli("run", str(cfg), "--output", str(model / "runs" / "t")), "inside the model folder")
    assert sorted(p.name for p in model.rglob("*")) == before
