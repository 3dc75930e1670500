"""Careless and hostile input, round two: what the newer features (lm-eval tasks, `!function`
helpers, few-shot pools, sliding-window models, child processes) do with it. Each test
reproduces one way a run could be made to lie, hang or read what it should not, and checks
that qeval refuses it in one line (exit 2) or tells the truth instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import GEN_ROWS, GEN_YAML, MODEL, ROOT, config_for, one_line_exit_2, run_cli, task_dir

# -- template output is bounded, however it is built ------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ '%0100000000d' % a }}",
        "{{ 'a'|center(100000000) }}",
        "{{ '{:>100000000}'.format(a) }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = 1 %}{% endfor %}{% endfor %}",
    ],
)
def test_template_output_is_bounded(tmp_path: Path, template: str) -> None:
    """A printf width, a filter argument, a format spec or nested loops: each would build
    gigabytes (or spin for hours) while validating; each is refused in well under a second."""
    folder = task_dir(
        tmp_path, GEN_YAML.replace('doc_to_text: "{{a}} + {{b}} ="', f"doc_to_text: {json.dumps(template)}"), GEN_ROWS
    )
    one_line_exit_2(run_cli("validate", str(config_for(tmp_path, folder)), timeout=60), "sandbox")


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{% set s='x'*100000 %}{% for a in s %}{% for c in s %}{% endfor %}{% endfor %}done", "took over 5 s"),
        ("{{ lipsum(1000000)|length }}", "took over 5 s"),
        # squaring in C past any timer: refused by the integer's size before it runs
        (
            "{% set ns=namespace(x=2) %}{% for i in range(40) %}{% set ns.x=ns.x*ns.x %}{% endfor %}{{ 1 }}",
            "integer too large",
        ),
    ],
)
def test_template_time_is_bounded(tmp_path: Path, template: str, says: str) -> None:
    """Work that prints nothing between two output pieces is stopped by the clock (5 s)."""
    folder = task_dir(
        tmp_path, GEN_YAML.replace('doc_to_text: "{{a}} + {{b}} ="', f"doc_to_text: {json.dumps(template)}"), GEN_ROWS
    )
    one_line_exit_2(run_cli("validate", str(config_for(tmp_path, folder)), timeout=60), says)


@pytest.mark.parametrize("template", ["{{ 1/0 }}", "{{ '%c' % 99999999 }}", "{{ 1e309|int }}"])
def test_a_template_that_raises_is_one_line(tmp_path: Path, template: str) -> None:
    folder = task_dir(
        tmp_path, GEN_YAML.replace('doc_to_text: "{{a}} + {{b}} ="', f"doc_to_text: {json.dumps(template)}"), GEN_ROWS
    )
    one_line_exit_2(run_cli("validate", str(config_for(tmp_path, folder))), "document 0")


def test_bounded_templates_still_render_formatting() -> None:
    """The bounds refuse only what builds an oversized string: big numbers, `range` as a value
    and ordinary padding render as jinja renders them."""
    from qeval.tasks.templates import render

    assert (
        render(
            "{{ '%05d' % a }} {{ 'ab'|center(6) }} {{ '{:>4}'.format(a) }}|{% for i in range(3) %}{{ i }}{% endfor %}",
            {"a": 3},
        )
        == "00003   ab      3|012"
    )
    doc = {"a": 3, "b": 12345678}
    assert (
        render("{{ (a + b)|string }} {{ '{:,}'.format(b) }} {{ b|abs }} {{ '{}: {}'.format(a, b) }}", doc)
        == "12345681 12,345,678 12345678 3: 12345678"
    )
    assert (
        render("{{ range(3) }} {{ range(10)|length }} {{ range(5)|last }} {{ range(10)[2] }}", doc)
        == "range(0, 3) 10 4 2"
    )


# -- lm-eval include folders: `!function` helpers, data files, base YAMLs ----------------------------

HELPER_YAML = """\
task: helper_task
dataset_path: json
dataset_kwargs: {data_files: {test: data/rows.jsonl, train: data/rows.jsonl}}
test_split: test
fewshot_split: train
output_type: multiple_choice
doc_to_text: !function utils.doc_to_text
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list: [{metric: acc}]
"""
HELPER_ROWS = [{"q": f"question {i}", "choices": ["yes", "no"], "label": i % 2} for i in range(6)]


def _helper_folder(tmp: Path, prefix: str = "Q: ", yaml_text: str = HELPER_YAML) -> Path:
    folder = tmp / "lm"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "helper.yaml").write_text(yaml_text)
    (folder / "utils.py").write_text(f"PREFIX = {prefix!r}\n\n\ndef doc_to_text(doc):\n    return PREFIX + doc['q']\n")
    (folder / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HELPER_ROWS))
    return folder


def _infos(folder: Path, num_fewshot: int = 0, seed: int = 1234, name: str = "helper_task") -> dict:
    from qeval.config.lm_eval import LmEvalSpec, LmEvalTask
    from qeval.tasks.lm_eval.session import open_session

    spec = LmEvalSpec(
        include_path=[str(folder)], fewshot_seed=seed, tasks=[LmEvalTask(name=name, num_fewshot=num_fewshot)]
    )
    session = open_session(spec, folder, None)
    try:
        return dict(session.infos)
    finally:
        session.close()


def test_a_changed_function_helper_changes_the_fingerprint(tmp_path: Path) -> None:
    """The helper reads a module constant: editing the constant (not the function's own
    source) must change the task's fingerprint, so stored results are recomputed, not paired
    with a baseline scored on the old prompt."""
    before = _infos(_helper_folder(tmp_path / "a", "Q: "))["helper_task"].fingerprint
    same = _infos(_helper_folder(tmp_path / "b", "Q: "))["helper_task"].fingerprint
    after = _infos(_helper_folder(tmp_path / "c", "Question: "))["helper_task"].fingerprint
    assert before == same != after


def test_records_whose_prompt_differs_are_not_paired(tmp_path: Path) -> None:
    from qeval.analysis.comparison import paired
    from qeval.records.store import RunStore

    store = RunStore(tmp_path)
    rows = [{"sample_id": str(i), "correct": 1, "prompt_hash": f"p{i}"} for i in range(4)]
    other = [dict(r, correct=0) | ({"prompt_hash": "changed"} if r["sample_id"] == "3" else {}) for r in rows]
    for setup, records in (("base", rows), ("q", other)):
        path = store.samples_path(setup, "t")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = paired(store, "base", "q", "t", "acc")
    assert data is not None and len(data.base) == 3  # document 3 was prompted differently: left out


def test_fewshot_seed_is_keyed_only_where_few_shot_sampling_uses_it(tmp_path: Path) -> None:
    folder = _helper_folder(tmp_path)
    zero = [_infos(folder, 0, seed)["helper_task"].fingerprint for seed in (1, 2)]
    shots = [_infos(folder, 2, seed)["helper_task"].fingerprint for seed in (1, 2)]
    assert zero[0] == zero[1]  # a 0-shot prompt does not depend on the seed: nothing recomputed
    assert shots[0] != shots[1]


@pytest.mark.parametrize("path", ["../../../../etc/hostname", "/etc/passwd"])
def test_data_files_outside_the_include_folder_are_refused(tmp_path: Path, path: str) -> None:
    from tests.helpers import make_config

    folder = _helper_folder(tmp_path, yaml_text=HELPER_YAML.replace("test: data/rows.jsonl", f"test: {path}"))
    lm_eval = {"include_path": [folder], "tasks": [{"name": "helper_task"}]}
    cfg = make_config(tmp_path, name="c", setups=[{"name": "base"}], tasks_dir=None, tasks=None, lm_eval=lm_eval)
    one_line_exit_2(run_cli("validate", str(cfg)), "is outside the include folder")
    # the config may allow a folder explicitly
    outside = tmp_path / "shared-data"
    outside.mkdir()
    (outside / "rows.jsonl").write_text((folder / "data" / "rows.jsonl").read_text())
    (folder / "helper.yaml").write_text(HELPER_YAML.replace("test: data/rows.jsonl", f"test: {outside}/rows.jsonl"))
    make_config(
        tmp_path,
        name="c",
        setups=[{"name": "base"}],
        tasks_dir=None,
        tasks=None,
        lm_eval=lm_eval | {"data_dirs": [outside]},
    )
    res = run_cli("validate", str(cfg))
    assert res.returncode == 0, res.stderr[-2000:]


def _outside_folder(tmp: Path) -> Path:
    secret = tmp / "secret"
    secret.mkdir()
    (secret / "rows.jsonl").write_text("".join(json.dumps(r | {"q": "SECRET"}) + "\n" for r in HELPER_ROWS))
    (secret / "base_out.yaml").write_text(HELPER_YAML.replace("data/rows.jsonl", f"{secret}/rows.jsonl"))
    return secret


@pytest.mark.parametrize("bypass", ["file_url", "include_out", "dataset_path", "data_dir", "glob_out"])
def test_every_way_to_data_outside_the_folder_is_refused(tmp_path: Path, bypass: str) -> None:
    from tests.helpers import make_config

    secret = _outside_folder(tmp_path)
    yaml_text = {
        "file_url": HELPER_YAML.replace("test: data/rows.jsonl", f"test: file://{secret}/rows.jsonl"),
        "include_out": "include: ../secret/base_out.yaml\ntask: helper_task\n",
        "dataset_path": HELPER_YAML.replace("dataset_path: json\n", f"dataset_path: {secret}\n").replace(
            "dataset_kwargs: {data_files: {test: data/rows.jsonl, train: data/rows.jsonl}}\n", ""
        ),
        "data_dir": HELPER_YAML.replace(
            "dataset_kwargs: {data_files: {test: data/rows.jsonl, train: data/rows.jsonl}}",
            f"dataset_kwargs: {{data_dir: {secret}}}",
        ),
        "glob_out": HELPER_YAML.replace("test: data/rows.jsonl", f"test: {secret}/*.jsonl"),
    }[bypass]
    folder = _helper_folder(tmp_path, yaml_text=yaml_text)
    cfg = make_config(
        tmp_path,
        name="c",
        setups=[{"name": "base"}],
        tasks_dir=None,
        tasks=None,
        lm_eval={"include_path": [folder], "tasks": [{"name": "helper_task"}]},
    )
    one_line_exit_2(run_cli("validate", str(cfg)), "is outside the include folder")


def test_a_glob_inside_the_folder_still_loads(tmp_path: Path) -> None:
    folder = _helper_folder(tmp_path, yaml_text=HELPER_YAML.replace("test: data/rows.jsonl", "test: data/r*.jsonl"))
    assert _infos(folder)["helper_task"].n_docs == len(HELPER_ROWS)


def test_a_base_yaml_include_beside_the_task(tmp_path: Path) -> None:
    """lm-eval's own pattern: `include: _base.yaml` beside the task, the base including a
    built-in task with relative data files. The include must reach the rewritten base."""

    folder = tmp_path / "lm"
    (folder / "data").mkdir(parents=True)
    for split in ("train", "test"):
        src = ROOT / "tasks" / "lm_eval" / "data" / "arc_easy" / f"{split}.jsonl"
        (folder / "data" / f"{split}.jsonl").write_text(src.read_text())
    (folder / "_base.yaml").write_text(
        "include: lm_eval/arc/arc_easy.yaml\ndataset_path: json\ndataset_name: null\n"
        "dataset_kwargs:\n  data_files: {train: data/train.jsonl, "
        "test: data/test.jsonl}\n"
    )
    (folder / "arc_base_local.yaml").write_text("include: _base.yaml\ntask: arc_base_local\n")
    infos = _infos(folder, name="arc_base_local")
    assert infos["arc_base_local"].n_docs > 0


def test_lm_eval_dropping_a_task_says_why(tmp_path: Path) -> None:
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "broken.yaml").write_text("include: missing_base.yaml\ntask: broken_task\n")
    from qeval.errors import UserError

    with pytest.raises(UserError) as err:
        _infos(folder, name="broken_task")
    assert "missing_base.yaml" in str(err.value) and "unknown lm-eval task" not in str(err.value)


def test_num_fewshot_larger_than_the_pool_is_refused_at_validate(tmp_path: Path) -> None:
    """50 shots from a pool of 6 validated, then failed in every setup after loading."""
    from tests.helpers import make_config

    folder = _helper_folder(tmp_path)

    def config(shots: int) -> Path:
        return make_config(
            tmp_path,
            name="c",
            setups=[{"name": "base"}],
            tasks_dir=None,
            tasks=None,
            lm_eval={"include_path": [folder], "tasks": [{"name": "helper_task", "num_fewshot": shots}]},
        )

    one_line_exit_2(run_cli("validate", str(config(50))), "num_fewshot 50 is larger than its few-shot pool of 6")
    assert run_cli("validate", str(config(5))).returncode == 0


# -- a quantized KV cache on a model with sliding-window layers ------------------------------------


def _sliding_model(tmp: Path, **fields: object) -> Path:
    import shutil

    dst = tmp / "sliding"
    shutil.copytree(MODEL, dst)
    cfg = json.loads((dst / "config.json").read_text()) | fields
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "fields",
    [
        {
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 64,
        },  # Gemma 3's form
        {"sliding_window": 64},  # Mistral's: every layer
    ],
)
def test_quantized_kv_cache_on_a_sliding_window_model_validates(tmp_path: Path, fields: dict) -> None:
    """qeval's own windowed quantized layer serves it (backends/hf/kv_cache.py)."""
    from tests.helpers import make_config

    model = _sliding_model(tmp_path, **fields)
    base, kv4 = {"name": "base", "baseline": True}, {"name": "kv4", "kv_cache": "int4"}
    cfg = make_config(tmp_path, name="c", model=model, tasks=["facts"], setups=[base, kv4])
    res = run_cli("validate", str(cfg))
    assert res.returncode == 0, res.stderr


def test_quantized_kv_cache_on_a_latent_attention_model_is_refused_before_loading(tmp_path: Path) -> None:
    from tests.helpers import make_config

    model = _sliding_model(tmp_path, kv_lora_rank=32, qk_rope_head_dim=8)
    base, kv4 = {"name": "base", "baseline": True}, {"name": "kv4", "kv_cache": "int4"}
    cfg = make_config(tmp_path, name="c", model=model, tasks=["facts"], setups=[base, kv4])
    one_line_exit_2(run_cli("validate", str(cfg)), "latent-attention (MLA)")
    make_config(tmp_path, name="c", model=model, tasks=["facts"], setups=[base, kv4 | {"optional": True}])
    res = run_cli("validate", str(cfg))
    assert res.returncode == 0 and "optional setup kv4 skipped" in res.stderr, res.stderr


def test_layer_types_follow_transformers() -> None:
    """qeval reads the layer kinds from config.json as transformers' cache does (checked against
    transformers itself for Llama, Mistral's all-sliding form and Gemma 3's `layer_types`)."""
    from transformers import AutoConfig
    from transformers.cache_utils import get_layer_types_and_kwargs

    from qeval.backends.hf.support import attention_layer_types

    base = {
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 128,
    }
    for model_type, fields in (
        ("llama", {}),
        ("mistral", {"sliding_window": 64}),
        ("gemma3_text", {"sliding_window": 64, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}),
    ):
        cfg = base | fields | {"model_type": model_type}
        theirs, _ = get_layer_types_and_kwargs(AutoConfig.for_model(**cfg))
        assert attention_layer_types(cfg) == [t.removesuffix("_attention") for t in theirs], model_type


# -- child processes die with qeval; a sweep probes once ----------------------------------------------


def _processes_with(text: str) -> list[int]:
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(int(pid))
    return found


@pytest.mark.slow
def test_the_ceilings_probe_dies_with_a_killed_run(tmp_path: Path) -> None:
    """kill -9 of `qeval run` while it says "measuring": the probe must not run on under PID 1
    (a rerun would race it for ceilings.probe.json)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    cfg = (ROOT / "configs" / "demo.yaml").read_text().replace("path: models/qeval-tiny", f"path: {MODEL}")
    (tmp_path / "c.yaml").write_text(cfg.replace("backend:", f"tasks_dir: {ROOT / 'tasks'}\nbackend:"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", "run", str(tmp_path / "c.yaml"), "--output", str(out), "--limit", "2"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "measuring" in line:
            break
    deadline = time.time() + 30
    while not _processes_with(str(out / "ceilings.probe.json")) and time.time() < deadline:
        time.sleep(0.05)
    assert _processes_with(str(out / "ceilings.probe.json")), "the probe did not start"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while _processes_with(str(out / "ceilings.probe.json")) and time.time() < deadline:
        time.sleep(0.1)
    assert not _processes_with(str(out / "ceilings.probe.json")), "the probe outlived its run"


def test_a_sweep_probes_each_device_once(tmp_path: Path) -> None:
    """The ceilings of one device and interpreter are measured once per process: a sweep's
    second model reuses them (a second probe here would fail: its interpreter does not exist)."""
    import sys

    from qeval.config import load_config
    from qeval.perf import ceilings
    from qeval.records.store import RunStore
    from qeval.run.preflight import preflight

    text = (ROOT / "configs" / "demo.yaml").read_text().replace("path: models/qeval-tiny", f"path: {MODEL}")
    (tmp_path / "c.yaml").write_text(text.replace("backend:", f"tasks_dir: {ROOT / 'tasks'}\nbackend:"))
    pre = preflight(load_config(tmp_path / "c.yaml"), None, None)
    first = ceilings.ensure_ceilings(pre, RunStore(tmp_path / "a"), sys.executable)
    assert first is not None and not first.get("error")
    monkey = pytest.MonkeyPatch()
    with monkey.context() as m:
        m.setattr(ceilings.subprocess, "run", lambda *a, **k: pytest.fail("probed twice"))
        second = ceilings.ensure_ceilings(pre, RunStore(tmp_path / "b"), sys.executable)
    assert second == first and (tmp_path / "b" / "ceilings.json").is_file()


def test_a_ray_cluster_that_is_not_there_writes_nothing(tmp_path: Path) -> None:
    """`address: auto` with no cluster on this machine: one line, exit 2, and no run directory
    (the marker and jobs/ were written before the connection failed)."""
    import os
    import subprocess
    import sys

    from tests.helpers import make_config

    empty = tmp_path / "no-ray"  # where Ray looks for a running cluster's address: nothing there
    empty.mkdir()
    make_config(
        tmp_path,
        name="c",
        tasks=["facts"],
        setups=[{"name": "base", "baseline": True}],
        executor={"kind": "ray", "address": "auto"},
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(empty), "TMPDIR": str(empty)}
    res = subprocess.run(
        [sys.executable, "-m", "qeval.cli", "run", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    one_line_exit_2(res, "cannot join the Ray cluster at auto")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_results_file_that_cannot_be_written_is_one_line_and_keeps_the_work(tmp_path: Path) -> None:
    """At the very end of a run (a full disk, an immutable results.json: here a folder in its
    place): one line, exit 1, every setup's stored results kept; the rerun after the fix
    recomputes nothing."""
    import shutil

    cfg = config_for(tmp_path, ROOT / "tasks", tasks=["facts"])
    out = tmp_path / "out"
    (out / "results.json").mkdir(parents=True)
    (out / "results.json" / "keep").write_text("x")  # not empty: os.replace onto it fails
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "4", "--force")
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "cannot write the run's files" in res.stderr.strip().splitlines()[-1]
    assert (out / "samples" / "int8" / "facts.jsonl").is_file()
    shutil.rmtree(out / "results.json")
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "4")
    assert res.returncode == 0 and "stored, skipped" in res.stderr and (out / "results.json").is_file()


SMOLLM2_GGUF = ROOT / "models" / "smollm2-gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2_GGUF.is_file(), reason="make smollm2 places the GGUF (CI runs it)")
def test_a_gguf_gets_its_own_tokenizer_not_the_folders(tmp_path: Path) -> None:
    """A .gguf beside another model's tokenizer.json: the load reads the GGUF's own tokenizer
    (49,152 entries), which its checksum covers, not the 128-entry one lying beside it."""
    from qeval.backends.hf.backend import HFBackend
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.setups import Setup

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / SMOLLM2_GGUF.name).symlink_to(SMOLLM2_GGUF)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text((MODEL / name).read_text())
    setup = Setup(name="base")
    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(folder / SMOLLM2_GGUF.name), dtype="float32", max_context=256),
        setups=[setup],
        tasks=["x"],
    )
    backend = HFBackend(cfg, setup, "cpu")
    backend.load()
    assert len(backend.tok) == 49152


@pytest.mark.slow
def test_the_vllm_engine_dies_with_a_killed_run(tmp_path: Path) -> None:
    """kill -9 of `qeval run` while vLLM serves: the worker dies with the runner, and vLLM's own
    engine core and workers with it (qeval's vLLM plugin), not seconds later under PID 1."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import make_config

    out = tmp_path / "out"
    make_config(
        tmp_path,
        name="vk",
        backend="vllm",
        setups=[{"name": "base", "baseline": True}],
        tasks=["compare_mc", "ppl", "facts"],
        batch_size=None,
        gates=None,
        # timed, so that vLLM runs its engine core and worker in processes of their own
        # (qeval/backends/vllm/backend.py `engine_in_process`); the kill lands before any timing
        performance={"input_len": 16, "output_len": 4, "num_requests": 2, "repeats": 1, "warmup": 0},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", "run", str(tmp_path / "c.yaml"), "--output", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "base: loading model done" in line:
            break

    worker = _processes_with(str(out / "jobs" / "base.json"))
    assert worker, "the worker is not running"
    # this run's engines only: another test's vLLM on the same machine is not this run's
    engines = [
        pid for pid in _processes_with("VLLM::") if Path(f"/proc/{pid}").exists() and _descends_from(pid, set(worker))
    ]
    assert engines, "the worker started no vLLM engine process"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 2
    alive = [p for p in engines + worker if _running(p)]
    while alive and time.time() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    assert not alive, f"outlived the run: {alive}"


def _descends_from(pid: int, ancestors: set[int]) -> bool:
    import psutil

    try:
        return any(p.pid in ancestors for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited (it waits for PID 1 to reap it)


def test_the_vllm_plugin_leaves_other_vllm_uses_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from qeval.backends.vllm import plugin

    monkeypatch.delenv("QEVAL_WORKER", raising=False)
    calls = []
    monkeypatch.setattr("qeval.files.processes.die_with_parent", lambda pid: calls.append(pid))
    plugin.register()
    assert calls == []
    monkeypatch.setenv("QEVAL_WORKER", "1")
    plugin.register()
    assert len(calls) == 1


@pytest.mark.slow
def test_a_killed_driver_leaves_no_local_ray_behind(tmp_path: Path) -> None:
    """kill -9 of `qeval run --executor ray` on a local Ray it started: Ray's GCS and raylet
    share its fate, and its dashboard and runtime-env agents (which outlived it by 50 s and more)
    are stopped by qeval's reaper within a few seconds."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    import psutil

    from tests.helpers import INT8, make_config

    ray_tmp = tempfile.mkdtemp(prefix="qr", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    make_config(
        tmp_path,
        name="rk",
        tasks=["compare_mc", "ppl"],
        setups=[{"name": "base", "baseline": True}, INT8],
        executor={"kind": "ray"},
        device=None,
        batch_size=None,
        gates=None,
        performance=None,
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", "run", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "out")],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "submitted" in line:
            break
    started = psutil.Process(proc.pid).children(recursive=True)
    agents = [p for p in started if "Agent" in " ".join(p.cmdline())]
    assert agents, [p.cmdline()[:1] for p in started]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 5
    alive = [p for p in started if _running(p.pid)]
    while alive and time.time() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _running(p.pid)]
    assert not alive, [(p.pid, p.cmdline()[:1]) for p in alive]
    import shutil

    shutil.rmtree(ray_tmp, ignore_errors=True)
