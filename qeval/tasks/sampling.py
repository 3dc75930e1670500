"""Sampled generation: a task's sampling parameters, with `from_model_card` read from the
model's generation_config.json, and one backend request per (document, repeat), each with
its own seed (backends/base.py `Sampling`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.backends.base import Sampling
from qeval.errors import UserError

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.tasks.native.tasks import TaskSpec

#: the generation_config.json keys a model card samples with
CARD_KEYS = ("temperature", "top_p", "top_k")


def model_card(cfg: RunConfig) -> dict[str, Any]:
    """The sampling keys of the model's generation_config.json (a local folder, or the hub's
    cached copy at the model's revision); {} where it has none."""
    path = cfg.model.path
    if Path(path).is_dir():
        card = Path(path) / "generation_config.json"
    else:
        try:
            from huggingface_hub import hf_hub_download

            card = Path(hf_hub_download(path, "generation_config.json", revision=cfg.model.revision))
        except Exception:  # noqa: BLE001 - no card cached (offline), or the repo has none
            return {}
    if not card.is_file():
        return {}
    try:
        data = json.loads(card.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{card}: not a readable JSON file ({exc})") from None
    return {k: data[k] for k in CARD_KEYS if isinstance(data, dict) and data.get(k) is not None}


def task_sampling(spec: TaskSpec, card: dict[str, Any]) -> tuple[float, float, int] | None:
    """(temperature, top_p, top_k) a task samples with, or None for greedy. With
    from_model_card the card's values fill the keys the task leaves unset; a card without any
    of them is one line (sampling with transformers' defaults would be a guess)."""
    g = spec.generation_kwargs
    if not g.do_sample:
        return None
    if g.from_model_card and not card:
        raise UserError(
            f"task {spec.task}: from_model_card, but the model's generation_config.json sets none of "
            f"{', '.join(CARD_KEYS)}; give them in the task's generation_kwargs"
        )
    card = card if g.from_model_card else {}
    temperature = g.temperature if g.temperature is not None else float(card.get("temperature", 1.0))
    top_p = g.top_p if g.top_p is not None else float(card.get("top_p", 1.0))
    top_k = g.top_k if g.top_k is not None else int(card.get("top_k", 0))
    if temperature <= 0:  # a card's temperature 0 means greedy in several servers: not a sampled task then
        raise UserError(f"task {spec.task}: sampling temperature {temperature} (from the model card) is not > 0")
    return temperature, top_p, top_k


def repeat_sampling(spec: TaskSpec, card: dict[str, Any]) -> list[Sampling | None]:
    """One Sampling per repeat (its seed), or [None] for a greedy task."""
    params = task_sampling(spec, card)
    if params is None:
        return [None]
    t, p, k = params
    return [Sampling(t, p, k, seed) for seed in spec.repeat_seeds()]
