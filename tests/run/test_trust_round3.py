"""Careless and hostile input, round three (issue 40: points 9, 11, 14): a task's sampling seeds,
a checkpoint that is not a checkpoint of the model, and the model's own chat template. Each is
refused at `qeval validate` in one line with exit 2, before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import GEN_ROWS, GEN_YAML, config_for, one_line_exit_2, run_cli, task_dir

SAMPLED = GEN_YAML.replace("max_gen_toks: 6}", "max_gen_toks: 6, do_sample: true, temperature: 0.7}")


@pytest.mark.parametrize(("seeds", "says"), [("[99999999999999999999]", "less than or equal to 4294967295"),
                                             ("[-3]", "greater than or equal to 0")])
def test_task_seeds_are_bounded(tmp_path: Path, seeds: str, says: str) -> None:
    """`seeds: [99999999999999999999]` passed validate, then every setup failed in torch."""
    folder = task_dir(tmp_path, SAMPLED + f"seeds: {seeds}\n", GEN_ROWS)
    one_line_exit_2(run_cli("validate", str(config_for(tmp_path, folder))), says)
