"""Careless and hostile input (docs/guarantees.md): each test reproduces one way a run could be made to
lie, lose data or run code, and checks that qeval refuses it or tells the truth instead.
Input errors are checked through the CLI, as a user meets them: one line, exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    GEN_ROWS,
    GEN_YAML,
    INT8,
    MC_YAML,
    MODEL,
    ROOT,
    SMALL_CONFIG,
    TASKS,
    config_for,
    one_line_exit_2,
    run_cli,
    task_dir,
    write_config,
)

CONFIG = SMALL_CONFIG
_one_line_exit_2, _task_dir, _config_for = one_line_exit_2, task_dir, config_for


# -- 1. templates are sandboxed ---------------------------------------------------------


@pytest.mark.parametrize("field", ["doc_to_text", "doc_to_target"])
def test_a_template_cannot_run_code(tmp_path: Path, field: str) -> None:
    marker = tmp_path / "pwned"
    attack = f"{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}"
    if field == "doc_to_target":
        attack = f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}; echo 30').read() }}}}"
    original = 'doc_to_text: "{{a}} + {{b}} ="' if field == "doc_to_text" else "doc_to_target: answer"
    yaml_text = GEN_YAML.replace(original, f'{field}: "{attack}"')
    folder = _task_dir(tmp_path, yaml_text, GEN_ROWS)
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path, folder))), "refused by the sandbox")
    res = run_cli("tasks", "--tasks-dir", str(folder))
    assert res.returncode == 2 and "sandbox" in res.stderr
    assert not marker.exists(), "the template ran a shell command"


def test_templates_still_render_data() -> None:
    from qeval.tasks import load_task

    task = load_task("addition", TASKS, limit=3)
    assert task.text(task.docs[0]).endswith("=")


# -- 2. names never become paths outside the run directory ------------------------------


@pytest.mark.parametrize("name", ["../../x", "/abs/file", "a/b", ".hidden", "x" * 300])
def test_task_names_are_safe(tmp_path: Path, name: str) -> None:
    folder = _task_dir(tmp_path, GEN_YAML.replace("task: t1", f"task: {json.dumps(name)}"), GEN_ROWS)
    res = run_cli("validate", str(_config_for(tmp_path, folder, tasks=[name])))
    _one_line_exit_2(res, "is not allowed as a name")


@pytest.mark.parametrize("name", ["../escape", "x" * 300, "a|b"])
def test_setup_names_are_safe(tmp_path: Path, name: str) -> None:
    from tests.helpers import BASELINE, make_config

    cfg = make_config(tmp_path, setups=[BASELINE, INT8 | {"name": name}])
    _one_line_exit_2(run_cli("validate", str(cfg)), "is not allowed as a name")


def test_store_paths_stay_inside_the_run_directory(tmp_path: Path) -> None:
    from qeval.errors import UserError
    from qeval.records.store import RunStore

    store = RunStore(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "samples").mkdir()
    (tmp_path / "run" / "samples" / "s").symlink_to(tmp_path)  # a planted link out of the run
    with pytest.raises(UserError, match="outside the run directory"):
        store.samples_path("../..", "x")
    with pytest.raises(UserError, match="outside the run directory"):
        store.samples_path("s", "x")
    assert store.samples_path("bf16", "t").parent == tmp_path / "run" / "samples" / "bf16"


# -- 3. bounded YAML ----------------------------------------------------------------------

BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
)


def test_alias_bomb_in_task_metadata_is_refused(tmp_path: Path) -> None:
    bomb = "metadata:\n" + "\n".join("  " + line for line in BOMB.splitlines()) + "\n"
    folder = _task_dir(tmp_path, GEN_YAML + bomb, GEN_ROWS)
    started = time.monotonic()
    res = run_cli("validate", str(_config_for(tmp_path, folder)), timeout=120)
    _one_line_exit_2(res, "alias bomb")
    assert time.monotonic() - started < 60


def test_alias_bomb_in_config_is_refused(tmp_path: Path) -> None:
    # the config's own text: the bomb is YAML anchors and aliases, which no mapping spells
    cfg = write_config(tmp_path / "c.yaml", CONFIG + "x_" + BOMB.replace("\n", "\nx_"))
    _one_line_exit_2(run_cli("validate", str(cfg), timeout=120), "alias bomb")


def test_ordinary_aliases_still_load(tmp_path: Path) -> None:
    from qeval.files.yaml import load_yaml

    (tmp_path / "a.yaml").write_text("base: &b {x: 1}\nother: *b\n")
    assert load_yaml(tmp_path / "a.yaml") == {"base": {"x": 1}, "other": {"x": 1}}


# -- 5. duplicate ids and empty data --------------------------------------------------------


def test_duplicate_document_ids_are_refused(tmp_path: Path) -> None:
    rows = [dict(r, id="same") for r in GEN_ROWS]
    folder = _task_dir(tmp_path, GEN_YAML, rows)
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path, folder))), "share the id 'same'")


def test_an_empty_task_is_refused(tmp_path: Path) -> None:
    folder = _task_dir(tmp_path, GEN_YAML, "")
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path, folder))), "has no documents")


# -- 13, 14. bad input is one line ---------------------------------------------------------


def test_a_mistyped_model_path_is_not_a_hub_id(tmp_path: Path) -> None:
    from tests.helpers import make_config

    cfg = make_config(tmp_path, model="models/qeval-tinyy")
    started = time.monotonic()
    res = run_cli("validate", str(cfg))
    _one_line_exit_2(res, "model path models/qeval-tinyy not found")
    assert time.monotonic() - started < 30


def test_an_unreachable_hub_id_is_one_line(tmp_path: Path) -> None:
    from tests.helpers import make_config

    cfg = make_config(tmp_path, model="no-such-org/no-such-model")
    _one_line_exit_2(run_cli("validate", str(cfg)), "model no-such-org/no-such-model: not a local folder")


def test_invalid_utf8_is_one_line(tmp_path: Path) -> None:
    from tests.helpers import make_config

    cfg = make_config(tmp_path)
    cfg.write_bytes(cfg.read_bytes() + b"# \xff\xfe\n")
    _one_line_exit_2(run_cli("validate", str(cfg)), "not UTF-8")
    folder = _task_dir(tmp_path / "x", GEN_YAML, GEN_ROWS)
    (folder / "t1.yaml").write_bytes(GEN_YAML.encode() + b"description: \xff\n")
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path / "x", folder))), "not UTF-8")
    folder = _task_dir(tmp_path / "y", GEN_YAML, GEN_ROWS)
    with (folder / "data" / "t1.jsonl").open("ab") as f:
        f.write(b'{"id": "z", "a": 1, "b": 2, "answer": "\xff"}\n')
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path / "y", folder))), "t1.jsonl:13: corrupt dataset line")


def test_an_output_path_that_cannot_hold_a_run_is_one_line(tmp_path: Path) -> None:
    from tests.helpers import make_config

    cfg = make_config(tmp_path)
    (tmp_path / "file").write_text("x")
    _one_line_exit_2(run_cli("run", str(cfg), "--output", str(tmp_path / "file")), "is not a directory")
    _one_line_exit_2(run_cli("run", str(cfg), "--output", str(tmp_path / "file" / "sub")), "cannot create it")


def test_a_long_setup_name_fails_at_validate_not_after_the_baseline(tmp_path: Path) -> None:
    from tests.helpers import BASELINE, make_config

    cfg = make_config(tmp_path, setups=[BASELINE, INT8 | {"name": "s" * 300}])
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"))
    _one_line_exit_2(res, "is not allowed as a name")
    assert not (tmp_path / "out").exists()


# -- 15. strict data types ------------------------------------------------------------------

MC_ROW = {"id": "0", "question": "Largest of 1 2:", "choices": ["1", "2"], "label": 1}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"choices": ["1", ""]}, "a choice is empty"),
        ({"label": 1.9}, "label 1.9 is not a choice index"),
        ({"label": True}, "label True is not a choice index"),
        ({"choices": "abcd"}, "choices must be a list"),
        ({"label": 5}, "label 5 out of range"),
    ],
)
def test_multiple_choice_data_is_checked_strictly(tmp_path: Path, change: dict, expected: str) -> None:
    rows = [dict(MC_ROW, id=str(i)) for i in range(5)]
    rows[3] |= change
    folder = _task_dir(tmp_path, MC_YAML, rows)
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path, folder))), expected)


def test_labels_as_digit_strings_and_choice_text_are_read() -> None:
    from qeval.tasks.native.tasks import _choice_index

    assert _choice_index("1", ["a", "b"]) == 1
    assert _choice_index("b", ["a", "b"]) == 1
    assert _choice_index(0, ["a", "b"]) == 0


# -- 16. generation keeps the end of the prompt ----------------------------------------------


def test_generation_keeps_the_last_prompt_tokens() -> None:
    from qeval.backends.tokens import generation_context

    assert generation_context(list(range(10)), 8, 6) == [8, 9]
    assert generation_context(list(range(10)), 6, 6) == [9]  # was: the whole prompt
    assert generation_context(list(range(10)), 4, 6) == [9]  # was: everything from token 2 on


def test_max_gen_toks_must_leave_room_for_a_prompt(tmp_path: Path) -> None:
    folder = _task_dir(tmp_path, GEN_YAML.replace("max_gen_toks: 6", "max_gen_toks: 300"), GEN_ROWS)
    _one_line_exit_2(run_cli("validate", str(_config_for(tmp_path, folder))), "leaves no room for the prompt")


# -- 8. the model checksum is over content ------------------------------------------------------


def test_a_same_size_same_mtime_model_is_a_different_model(tmp_path: Path) -> None:
    """Files over 256 MiB used to be keyed by size and mtime: `cp -p` of another model of the
    same size reused the old results. (A sparse file keeps this test cheap.)"""
    from qeval.model.source import folder_checksum as checksum

    model = tmp_path / "m"
    model.mkdir()
    big = model / "model.safetensors"
    with big.open("wb") as f:
        f.truncate(300 * 2**20)
    stat = big.stat()
    before = checksum(model)
    with big.open("r+b") as f:
        f.seek(150 * 2**20)
        f.write(b"\x01")
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert big.stat().st_size == stat.st_size and big.stat().st_mtime_ns == stat.st_mtime_ns
    after = checksum(model)
    assert before != after


# -- 17. reports escape content and never fail on it -----------------------------------------------


def test_report_escapes_hostile_names_and_survives_mathtext(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "run-v1", run)
    text = (run / "results.json").read_text()
    text = text.replace('"facts"', '"fa|cts<img src=x onerror=alert(1)>"').replace('"addition"', '"$\\\\foo$"')
    (run / "results.json").write_text(text)
    res = run_cli("report", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    md = (run / "report.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    cells = {len(line.replace("\\|", "").split("|")) for line in table[:3]}
    assert len(cells) == 1, table[:3]  # header and rows have the same number of cells
    assert "<img" not in md and "&lt;img" in md
    html = (run / "report.html").read_text()
    assert "<img" not in html and "$\\foo$" in html
    assert html.count('<figure class="plot">') == 3 and "plot not drawn" not in html


def test_report_on_a_truncated_results_or_samples_file_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "run-v1", run)
    samples = run / "samples" / "int8" / "addition.jsonl"
    samples.write_text(samples.read_text()[:-40])
    _one_line_exit_2(run_cli("report", str(run)), "corrupt samples line")
    results = run / "results.json"
    results.write_text(results.read_text()[:500])
    _one_line_exit_2(run_cli("report", str(run)), "corrupt JSON")
    results.write_text("[1, 2]")
    _one_line_exit_2(run_cli("report", str(run)), "schema_version")


# -- 11, 12. the run directory: ownership and the lock --------------------------------------------


def test_a_folder_holding_foreign_files_is_not_overwritten(tmp_path: Path) -> None:
    from tests.helpers import make_config

    cfg = make_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"mine": true}')
    _one_line_exit_2(run_cli("run", str(cfg), "--output", str(out), "--limit", "4"), "holds files qeval did not write")
    assert (out / "results.json").read_text() == '{"mine": true}'
    other = tmp_path / "other"
    other.mkdir()
    (other / ".qeval-run.json").write_text('{"config_name": "someone-else"}')
    _one_line_exit_2(
        run_cli("run", str(cfg), "--output", str(other), "--limit", "4"), "holds the run of config 'someone-else'"
    )


def _start_run(cfg: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", "run", str(cfg), "--output", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_worker(parent: subprocess.Popen[str], timeout: float = 120) -> list:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [
            p
            for p in psutil.Process(parent.pid).children(recursive=True)
            if "qeval.run.worker" in " ".join(p.cmdline())
        ]
        if kids:
            return kids
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.2)
    raise AssertionError("no worker started")


@pytest.mark.slow
def test_a_second_run_is_refused_and_a_killed_runner_takes_its_worker_along(tmp_path: Path) -> None:
    import psutil

    from tests.helpers import make_config

    cfg = make_config(tmp_path, tasks=["addition", "ppl"])
    out = tmp_path / "out"
    first = _start_run(cfg, out)
    try:
        workers = _wait_for_worker(first)
        second = run_cli("run", str(cfg), "--output", str(out))
        _one_line_exit_2(second, f"another qeval run (PID {first.pid}) is writing to it")
        first.kill()  # SIGKILL: no chance to clean up
        first.wait()
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"worker outlived its runner: {alive}"
    finally:
        if first.poll() is None:
            first.kill()
    # the lock died with its holder: a new run takes the folder and resumes
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "6")
    assert res.returncode == 0, res.stderr[-2000:]


# -- 4, 6, 7, 9, 10. what a run reports, and its exit code ----------------------------------------


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _setup(results: dict, name: str) -> dict:
    return next(s for s in results["setups"] if s["name"] == name)


@pytest.mark.slow
def test_a_failed_baseline_recommends_nothing_and_exits_1(tmp_path: Path) -> None:
    from tests.helpers import BASELINE, make_config

    cfg = make_config(tmp_path, setups=[BASELINE | {"memory_limit_mib": 1}, INT8], candidate="int8")
    out = tmp_path / "out"
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "8", "--fail-on-gate")
    assert res.returncode == 1, res.stderr[-2000:]
    r = _results(out)
    assert _setup(r, "bf16")["status"] == "failed" and _setup(r, "int8")["status"] == "ok"
    assert r["recommendation"]["setup"] is None
    assert "baseline bf16 failed" in r["recommendation"]["blocked"]
    assert not _setup(r, "int8")["vs_baseline"]
    md = (out / "report.md").read_text()
    assert "No recommendation: the baseline bf16 failed" in md
    assert "not compared, so not recommended: the baseline bf16 failed" in md


@pytest.mark.slow
def test_exit_codes_and_what_reruns_recompute(tmp_path: Path) -> None:
    from tests.helpers import BASELINE, make_config

    out = tmp_path / "out"
    setups = [BASELINE, INT8, {"name": "kv2", "kv_cache": "int2"}]
    cfg = make_config(tmp_path, setups=setups, candidate="kv2")
    # 3: every setup scored, the candidate fails its gate (an int2 KV cache wrecks addition)
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "30", "--fail-on-gate")
    assert res.returncode == 3, res.stderr[-2000:]
    assert "candidate kv2 does not pass every gate" in res.stderr
    first = _results(out)
    # 0: the same run without --fail-on-gate; everything stored, nothing recomputed
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "30")
    assert res.returncode == 0 and res.stderr.count("skipped") == 3, res.stderr[-2000:]
    # 9: a setup recorded as failed after storing every task is rerun, and only what is missing computed
    outcome = out / "setups" / "int8.json"
    stored = json.loads(outcome.read_text())
    outcome.write_text(json.dumps(stored | {"status": "failed", "error": "out of memory"}))
    sample = out / "samples" / "int8" / "addition.jsonl"
    mtime = sample.stat().st_mtime_ns
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "30")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "int8: loading model" in res.stderr and "int8: addition" not in res.stderr
    assert sample.stat().st_mtime_ns == mtime
    assert _setup(_results(out), "int8")["status"] == "ok"
    # 14: a corrupt meta file is recomputed, with a warning, not a traceback
    (out / "samples" / "kv2" / "addition.meta.json").write_text("{trunc")
    res = run_cli("run", str(cfg), "--output", str(out), "--limit", "30")
    assert res.returncode == 0 and "Traceback" not in res.stderr
    assert "corrupt JSON" in res.stderr and "kv2: addition" in res.stderr
    # 10: batch_size changes the numerics, so it is part of the key (the baseline alone shows it)
    cfg4 = make_config(tmp_path, setups=setups, batch_size=4)
    res = run_cli("run", str(cfg4), "--output", str(out), "--limit", "30", "--setups", "bf16")
    assert res.returncode == 0 and "skipped" not in res.stderr and "bf16: addition" in res.stderr, res.stderr[-2000:]
    assert first["setups"]  # (the first run's results were complete)


@pytest.mark.slow
def test_results_of_another_run_are_dropped_visibly(tmp_path: Path) -> None:
    """7: a copied run directory rerun with --limit 20 --setups int8: the other setups' 30-sample
    scores must not sit next to a 20-sample baseline."""
    from tests.helpers import BASELINE, make_config

    setups = [BASELINE, INT8, {"name": "kv4", "kv_cache": "int4"}]
    cfg = make_config(tmp_path, setups=setups)
    out = tmp_path / "out"
    assert run_cli("run", str(cfg), "--output", str(out), "--limit", "30").returncode == 0
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    res = run_cli("run", str(cfg), "--output", str(copy), "--limit", "20", "--setups", "int8")
    assert res.returncode == 0, res.stderr[-2000:]
    r = _results(copy)
    assert [s["name"] for s in r["setups"]] == ["bf16", "int8"]
    assert all(t["n"] == 20 for s in r["setups"] for t in s["tasks"].values())
    assert {d["setup"] for d in r["dropped"]} == {"kv4"}
    assert "limit 30 -> 20" in r["dropped"][0]["reason"]
    assert "not compared: setup kv4" in (copy / "report.md").read_text()
    # a changed model: every stored result is dropped and recomputed, never shown under the new checksum
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    (model / "README.md").write_text("changed\n")
    cfg2 = make_config(tmp_path, filename="c2.yaml", setups=setups, model=model)
    res = run_cli("run", str(cfg2), "--output", str(out), "--limit", "30", "--setups", "int8")
    assert res.returncode == 0 and "skipped" not in res.stderr, res.stderr[-2000:]
    r = _results(out)
    assert [s["name"] for s in r["setups"]] == ["bf16", "int8"] and {d["setup"] for d in r["dropped"]} == {"kv4"}
