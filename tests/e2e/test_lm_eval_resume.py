"""`qeval run` killed in the middle of an lm-eval task carries on from its last finished chunk
of documents (qeval/tasks/lm_eval/resume.py), and ends with what an uninterrupted run stores;
`--force` takes up nothing saved. Real parts: SmolLM2 on the transformers backend, lm-eval's
own YAML for the offline wikitext fixture (rolling perplexity, a few seconds a document), two
documents a chunk; the runner is SIGKILLed (its worker goes with it) once a chunk is saved."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, TASKS, make_config, run_cli

pytestmark = pytest.mark.slow
SMOLLM2 = ROOT / "models" / "smollm2-135m"
DOCS, CHUNK = 4, 2  # killed after its first chunk: a second chunk left to carry on with


def _config(tmp: Path) -> Path:
    return make_config(
        tmp,
        model={"path": str(SMOLLM2), "dtype": "float32", "max_context": 2048},
        setups=[{"name": "base", "baseline": True}],
        tasks=None,
        gates=None,
        batch_size=4,
        lm_eval={
            "include_path": [str(TASKS / "lm_eval")],
            "chunk_docs": CHUNK,
            "tasks": [{"name": "wikitext_local", "limit": DOCS}],
        },
    )


def _killed_after_a_chunk(cfg: Path, out: Path, timeout: float = 600) -> None:
    """Start `qeval run`, SIGKILL it once a chunk's state is saved, before the task is stored."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "qeval.cli", "run", str(cfg), "--output", str(out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    scratch = out / "samples" / "base" / ".scratch"
    deadline = time.monotonic() + timeout
    try:
        while not list(scratch.glob("lm_eval.*.state.npz")):
            assert proc.poll() is None, f"the run ended before any chunk was saved: {proc.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "no chunk saved in time"
            time.sleep(0.05)
        workers = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if "qeval.run.worker" in " ".join(p.cmdline())
        ]
        proc.kill()
        proc.wait()
        psutil.wait_procs(workers, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (out / "samples" / "base" / "wikitext_local.jsonl").exists(), "killed too late: the task was stored"


def _stored(out: Path) -> tuple[list[dict], dict]:
    lines = (out / "samples" / "base" / "wikitext_local.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    task = json.loads((out / "results.json").read_text())["setups"][0]["tasks"]["wikitext_local"]
    return records, task


def test_a_killed_run_carries_on_from_its_last_chunk_and_force_starts_over(tmp_path: Path) -> None:
    assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
    cfg = _config(tmp_path)

    # --force after a kill: every document scored again, nothing saved taken up
    forced = tmp_path / "forced"
    _killed_after_a_chunk(cfg, forced)
    res = run_cli("run", str(cfg), "--output", str(forced), "--force")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "carrying on from document" not in res.stderr
    reference, ref_task = _stored(forced)
    assert [r["doc_id"] for r in reference] == list(range(DOCS))

    # a plain rerun after a kill: only the chunks after the saved ones
    out = tmp_path / "out"
    _killed_after_a_chunk(cfg, out)
    res = run_cli("run", str(cfg), "--output", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stderr.splitlines() if "carrying on from document" in x)
    start = int(line.split("carrying on from document ")[1].split()[0])
    assert start in range(CHUNK, DOCS, CHUNK), line
    records, task = _stored(out)
    assert [r["doc_id"] for r in records] == list(range(DOCS))  # no document twice, none missing
    for a, b in zip(reference, records, strict=True):
        assert b["prompt_hash"] == a["prompt_hash"] and b["n_tokens"] == a["n_tokens"]
        assert b["nll"] == pytest.approx(a["nll"], abs=1e-4), a["doc_id"]
    assert task["n"] == ref_task["n"] == DOCS
    for name, m in ref_task["metrics"].items():
        assert task["metrics"][name]["value"] == pytest.approx(m["value"], rel=1e-5), name
    assert not (out / "samples" / "base" / ".scratch").exists()  # stored: nothing left to resume
