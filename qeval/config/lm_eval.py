"""The run config's `lm_eval:` piece: lm-evaluation-harness tasks, groups and suites scored by
qeval's backends (docs/tasks.md, "Standard benchmarks")."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from qeval.config.chat import ChatKeys
from qeval.strict import Seed, Strict


class LmEvalTask(ChatKeys):
    """One lm-eval task or group, with the settings it is scored under (its chat keys, where
    set, override the run's: qeval/config/chat.py)."""

    #: the lm-eval task or group name (mmlu, gsm8k, hellaswag, arc_challenge, a team's own...)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    #: few-shot examples (lm-eval's rule: a task whose YAML fixes num_fewshot: 0 stays 0-shot)
    num_fewshot: int | None = Field(default=None, ge=0)
    #: score only the first N documents of each of its tasks (overrides the config's `limit`)
    limit: int | None = Field(default=None, gt=0)
    #: the metric setups are compared on, as lm-eval names it ("acc_norm", "exact_match,strict-match");
    #: default: the task's first metric under its first filter
    metric: str | None = None
    #: cap on generated tokens for generation tasks (lm-eval's default is 256)
    max_gen_toks: int | None = Field(default=None, gt=0)
    #: the data, instead of the task's own: a hub id or a local dataset folder, its config, and
    #: `load_dataset` arguments (e.g. {revision: <sha>} to pin a hub dataset, {data_files: ...})
    dataset_path: str | None = None
    dataset_name: str | None = None
    dataset_kwargs: dict[str, Any] | None = None


class LmEvalSpec(Strict):
    """lm-eval tasks of a run. Names resolve in `include_path` first (a team's own YAMLs, or the
    shipped offline fixtures in tasks/lm_eval), then in lm-eval's own task library."""

    include_path: list[str] = []
    #: folders outside the include folders that their task YAMLs may read data files from (by
    #: default a YAML reads data only from inside its own include folder)
    data_dirs: list[str] = []
    #: the seed of lm-eval's few-shot sampler (one per task, drawn document by document)
    fewshot_seed: Seed = 1234
    #: documents per lm-eval `evaluate()` call: what a worker holds at once, and what an
    #: interrupted run scores again (it carries on from its last finished chunk)
    chunk_docs: int = Field(default=1000, ge=1)
    tasks: list[LmEvalTask] = []
    #: named lists of tasks (SUITES), e.g. openllm-v1
    suites: list[str] = []

    @model_validator(mode="after")
    def _check(self) -> LmEvalSpec:
        unknown = [s for s in self.suites if s not in SUITES]
        if unknown:
            raise ValueError(f"unknown suite {unknown[0]!r} (known: {', '.join(sorted(SUITES))})")
        names = [t.name for t in self.entries()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"lm-eval task listed twice: {', '.join(dupes)}")
        return self

    def entries(self) -> list[LmEvalTask]:
        """The explicit tasks, then each suite's (a task named in both keeps the explicit settings)."""
        explicit = {t.name for t in self.tasks}
        return self.tasks + [t for s in self.suites for t in SUITES[s] if t.name not in explicit]

    def suite_members(self) -> dict[str, list[str]]:
        """suite -> the task names it averages over."""
        return {s: [t.name for t in SUITES[s]] for s in self.suites}


def _suite(*entries: tuple[str, int, str]) -> list[LmEvalTask]:
    return [LmEvalTask(name=n, num_fewshot=k, metric=m) for n, k, m in entries]


#: The Open LLM Leaderboard v1 selection, as Red Hat's and llm-compressor's model cards report
#: recovery on it: the shot counts and metrics of the leaderboard.
_OPENLLM_V1 = [
    ("arc_challenge", 25, "acc_norm"),
    ("hellaswag", 10, "acc_norm"),
    ("mmlu", 5, "acc"),
    ("truthfulqa_mc2", 0, "acc"),
    ("winogrande", 5, "acc"),
    ("gsm8k", 5, "exact_match,strict-match"),
]

SUITES: dict[str, list[LmEvalTask]] = {
    "openllm-v1": _suite(*_OPENLLM_V1),
    # the same selection on the offline fixtures that ship in tasks/lm_eval (include_path: [tasks/lm_eval]);
    # few-shot counts capped by the fixtures' small few-shot pools
    "openllm-v1-local": _suite(
        ("arc_challenge_local", 5, "acc_norm"),
        ("hellaswag_local", 5, "acc_norm"),
        ("mmlu_local", 5, "acc"),
        ("truthfulqa_mc2_local", 0, "acc"),
        ("winogrande_local", 5, "acc"),
        ("gsm8k_local", 3, "exact_match,strict-match"),
    ),
}
