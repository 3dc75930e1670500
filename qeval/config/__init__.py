"""The run configuration, on the ground floor: one module per config piece (gates, engine,
budget, performance, quantize, executor, lm_eval, long_context, setups), composed into
`RunConfig` in run.py. Nothing here imports above it (docs/architecture.md, "Layers")."""

from qeval.config.run import (
    ModelSpec,
    RunConfig,
    case_collisions,
    config_from_dict,
    first_error,
    folder_names_problem,
    load_config,
)

__all__ = [
    "ModelSpec",
    "RunConfig",
    "case_collisions",
    "config_from_dict",
    "first_error",
    "folder_names_problem",
    "load_config",
]
