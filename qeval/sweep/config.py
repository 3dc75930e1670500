"""A sweep config: one run config with `models:` (a list) in place of `model:`.

    name: compare-models
    models:
      - {name: base, path: org/Model-8B, dtype: bfloat16}
      - {name: awq, path: org/Model-8B-AWQ, setups: [{name: w4a16, baseline: true}]}
    setups: [...]      # the setups of every model that gives none of its own
    tasks: [...]       # every other key applies to every model

Each model becomes an ordinary RunConfig named after it; the sweep's `executor` runs all of
their jobs together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from qeval.config import ModelSpec, RunConfig, config_from_dict, first_error, folder_names_problem
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.files.names import NAME_PATTERN, check_name
from qeval.files.yaml import load_yaml

#: the keys of a `models:` entry that are not the model's own (ModelSpec) settings
_SWEEP_KEYS = ("name", "setups", "candidate")


class SweepModel(ModelSpec):
    """One model of a sweep: where it comes from, and optionally its own setups and candidate."""

    name: str = Field(pattern=NAME_PATTERN)
    setups: list[Setup] | None = Field(default=None, min_length=1)
    candidate: str | None = None


@dataclass(frozen=True)
class Sweep:
    """A checked sweep config: each model's run config, in the config's order."""

    name: str
    configs: dict[str, RunConfig]

    @property
    def reference(self) -> str:
        """The model the others' baselines are compared with: the first listed."""
        return next(iter(self.configs))


def load_sweep(path: Path) -> Sweep | None:
    """The sweep `path` describes, or None when it gives one `model:` (an ordinary run)."""
    raw = load_yaml(path)
    if not isinstance(raw, dict) or "models" not in raw:
        return None
    if "model" in raw:
        raise UserError(f"{path}: give `model` (one model) or `models` (a sweep), not both")
    entries = raw["models"]
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{path}: models: expected a list of models, each a mapping with name and path")
    if not isinstance(raw.get("name"), str):
        raise UserError(f"{path}: name: a sweep needs a name (letters, digits, '.', '_' and '-')")
    try:
        name = check_name("sweep", raw["name"])
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    common = {k: v for k, v in raw.items() if k != "models"}
    models: list[SweepModel] = []
    for i, entry in enumerate(entries):
        try:
            models.append(SweepModel.model_validate(entry))
        except ValidationError as exc:
            raise UserError(f"{path}: models.{i}.{first_error(exc)}") from None
    _check_model_names(path, [m.name for m in models])
    for m in models:
        if m.setups is None and "setups" not in common:
            raise UserError(
                f"{path}: models.{m.name}: no setups: give the model its own `setups:`, or the sweep "
                "`setups:` for the models that give none"
            )
    _check_common_keys(path, common)
    configs = {
        m.name: config_from_dict(
            _model_config(common, entry, m), path, where=f"models.{m.name}: ", own=_own_keys(entry)
        )
        for m, entry in zip(models, entries, strict=True)
    }
    return Sweep(name, configs)


def _check_model_names(path: Path, names: list[str]) -> None:
    """Each model has a run folder of its own: names must differ, and not only in case."""
    problem = folder_names_problem(names, "model")
    if problem:
        raise UserError(f"{path}: models: {problem}")


def _check_common_keys(path: Path, common: dict[str, Any]) -> None:
    """An unknown key at the top level is the sweep's, not its first model's: name it as written."""
    for key in common:
        if key not in RunConfig.model_fields:
            hint = (
                " (a model's own setting: give it in each entry of `models:`)" if key in ModelSpec.model_fields else ""
            )
            raise UserError(f"{path}: {key}: unknown key{hint}")


def _own_keys(entry: dict[str, Any]) -> frozenset[str]:
    """The run-config keys a `models:` entry gives itself: an error there is the model's."""
    return frozenset({"name", "model"} | {k for k in ("setups", "candidate") if k in entry})


def _model_config(common: dict[str, Any], entry: dict[str, Any], model: SweepModel) -> dict[str, Any]:
    """One model's run config: the sweep's keys, its model, its setups (else the sweep's)."""
    raw = common | {"name": model.name, "model": {k: v for k, v in entry.items() if k not in _SWEEP_KEYS}}
    if "setups" in entry:
        raw["setups"] = entry["setups"]
    if model.candidate is not None:
        raw["candidate"] = model.candidate
    return raw
