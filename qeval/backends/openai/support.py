"""What the openai backend asks of its server and refuses, checked before any worker starts.

Launch mode serves a setup with vLLM's OpenAI server, started through its module (the CPU
build's `vllm` console script fails on a version lookup):

    <vLLM's python> -m vllm.entrypoints.openai.api_server --model ... --host 127.0.0.1 --port <free>

with the setup's engine arguments from the *same* translation table as the in-process vllm
backend (qeval/backends/vllm/support.py: `setup_engine_args`), each `key=value` as `--key value`
and a boolean as `--key` / `--no-key`, so a launched setup and an in-process one run the same
engine. Another server (SGLang, TGI, llama.cpp) is started from `server.command`, a template;
qeval then translates nothing but the served folder, so a setup that needs engine flags
(a KV-cache dtype, on-the-fly quantization) is refused: the command must say them itself.

Attach mode sends every setup to `base_url` (one attached server per run, or per
`--setups`). qeval cannot see how the server was started, so the setup's spec is taken as the
operator's description of it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from qeval.backends.base import TOPK
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.memory.layouts import KvRule

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.config.server import ServerSpec
    from qeval.records.preflight import Preflight

#: the vLLM module that serves the OpenAI API (vLLM 0.32: vllm/entrypoints/openai/api_server.py)
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: the model name a launched vLLM serves under when the config names none
DEFAULT_SERVED_NAME = "qeval"
#: the shortest API key qeval sends: a shorter one ("x", "1", "EMPTY") occurs by chance in answers,
#: from which the key is scrubbed (qeval/backends/openai/client.py), and would change them
MIN_KEY_CHARS = 8
#: output types scored from generated text alone; every other one needs prompt log-probabilities
GENERATION_TYPES = frozenset({"generate_until"})


def server_spec(cfg: RunConfig) -> ServerSpec:
    """The config's `server:` block; one line when a run on the openai backend has none."""
    if cfg.server is None:
        raise UserError(
            "backend openai: the config needs a `server:` block (mode attach with base_url and "
            'model, or mode launch): docs/backends.md, "OpenAI-compatible servers"'
        )
    return cfg.server


def endpoint(cfg: RunConfig, setup: Setup) -> tuple[str, str]:
    """Attach mode: (base_url, served model name) of `setup`."""
    spec = server_spec(cfg)
    assert spec.base_url is not None and spec.model is not None  # ServerSpec checks attach has both
    return spec.base_url, spec.model


def validate(setup: Setup, device: str) -> None:
    """Nothing without the config: validate_served decides (how the server is started matters)."""


def validate_served(cfg: RunConfig, setup: Setup, device: str) -> None:
    """Raise one line for a setup this server cannot serve: a launched vLLM refuses what the
    in-process engine refuses on this device; a command template translates only the served
    folder. An attached server is the operator's: qeval refuses nothing of its setups."""
    spec = server_spec(cfg)
    if spec.mode == "attach":
        return
    if spec.command is None:
        from qeval.backends.vllm.support import validate as vllm_validate

        vllm_validate(setup, device)
    elif setup.kv_cache != "auto" or (setup.weights == "fp8" and setup.method == "rtn") or setup.method == "bnb":
        raise UserError(
            f"setup {setup.name!r} on openai/launch with a command template: qeval translates only the "
            "served folder ({model}) for another server; put its KV-cache or quantization flags in "
            "server.command and name the setup after them"
        )


def check_install(cfg: RunConfig) -> None:
    """Raise one line when a launched vLLM is not installed where the server would run."""
    spec = server_spec(cfg)
    if spec.mode == "launch" and spec.command is None:
        from qeval.backends.vllm.install import check_install as vllm_install

        vllm_install(cfg)


def worker_python(cfg: RunConfig) -> str:
    """The worker is an HTTP client with the model's tokenizer: qeval's own interpreter."""
    return sys.executable


def server_python(cfg: RunConfig) -> str:
    """The interpreter a launched vLLM server runs in (the vllm backend's: .venv-vllm, QEVAL_VLLM_PYTHON)."""
    from qeval.backends.vllm.install import worker_python as vllm_python

    return vllm_python(cfg)


def key_parts(cfg: RunConfig) -> dict[str, str]:
    """What changes the numbers beyond the common parts: the server (mode, model name, how
    log-probs are asked for, attach: its URL; launch: the command or vLLM's engine settings).
    The port is not one: it changes from run to run."""
    spec = server_spec(cfg)
    parts = {"mode": spec.mode, "served_model": spec.model or DEFAULT_SERVED_NAME, "logprobs": spec.logprobs}
    if spec.mode == "attach":
        parts["base_url"] = spec.base_url or ""
    elif spec.command is not None:
        parts["command"] = json.dumps(spec.command)
    else:
        parts["engine"] = cfg.engine.key_json()
    return parts


#: `vllm serve`'s batched tokens on the CPU build (its LLM class takes 4,096): vLLM 0.32.0,
#: vllm/engine/arg_utils.py `get_batch_defaults`, CPU: {LLM_CLASS: 4096, OPENAI_API_SERVER: 2048} x world size
SERVE_CPU_BATCHED_TOKENS = 2048


def kv_accounting(cfg: RunConfig, device: str) -> KvRule | None:
    """Whose rules size a sequence's KV cache on the server: vLLM's, where qeval launches vLLM's
    server (the in-process engine's settings, as the same translation passes them, but serve's
    batched tokens on a CPU); None for an attached server or a `command` template: qeval cannot
    see which engine serves, so it predicts no sequence rather than apply one engine's rules to
    another's cache (transformers' rules, which earlier versions applied here, fit no server)."""
    spec = server_spec(cfg)
    if spec.mode != "launch" or spec.command is not None:
        return None
    from dataclasses import replace

    from qeval.backends.vllm.kv_rule import PagedKv
    from qeval.backends.vllm.support import cache_accounting

    vllm = cache_accounting(device)
    if device != "cuda":  # on a GPU cache_accounting is `vllm serve`'s defaults already
        vllm = replace(vllm, in_flight_tokens=SERVE_CPU_BATCHED_TOKENS)
    return PagedKv(vllm)


def serve_argv(cfg: RunConfig, setup: Setup, device: str, port: int, host: str) -> tuple[list[str], dict[str, object]]:
    """The launch command line of `setup` and the engine arguments it came from."""
    spec = server_spec(cfg)
    name = spec.model or DEFAULT_SERVED_NAME
    if spec.command is not None:
        fields = {
            "model": setup.checkpoint or cfg.model.path,
            "host": host,
            "port": str(port),
            "served_model_name": name,
            "dtype": cfg.model.dtype,
            "max_model_len": str(cfg.model.max_context),
        }
        return [part.format(**fields) for part in spec.command], {"command": spec.command}
    from qeval.backends.vllm.support import setup_engine_args

    args = setup_engine_args(cfg, setup, device)
    # the top-k of every prompt position plus the actual token, as the in-process backend asks
    return vllm_server_argv(cfg, args, host, port, name, ["--max-logprobs", str(TOPK + 1)]), args


def vllm_server_argv(
    cfg: RunConfig, args: dict[str, Any], host: str, port: int, name: str, extra: list[str] | None = None
) -> list[str]:
    """`vllm serve` in vLLM's interpreter on host:port, serving as `name`, with the engine
    arguments `args` as flags (`extra` options before them): the openai backend's launch and
    `qeval goodput`'s servers (qeval/backends/vllm/serve.py)."""
    return [
        server_python(cfg),
        "-m",
        VLLM_SERVER_MODULE,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        name,
        *(extra or []),
        "--disable-uvicorn-access-log",
        # request defaults from vLLM, not from the model's generation_config.json: the in-process
        # engine never reads that file (qeval's requests set every sampling field as well)
        "--generation-config",
        "vllm",
        *flags(args),
    ]


def flags(args: dict[str, object]) -> list[str]:
    """Engine arguments as vLLM's command line spells them (its EngineArgs argparse: `--key-name
    value`, booleans as BooleanOptionalAction `--key` / `--no-key`)."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):  # a list option (nargs="+"): its values after the flag
            out += [flag, *map(str, value)]
        elif value is not None:
            out += [flag, str(value)]
    return out


def api_key(cfg: RunConfig) -> str | None:
    """The API key from the environment variable the config names; one line when it is unset."""
    spec = server_spec(cfg)
    if spec.api_key_env is None:
        return None
    key = (os.environ.get(spec.api_key_env) or "").strip()  # a CRLF .env file leaves a \r behind
    if not key:
        raise UserError(f"server.api_key_env: the environment variable {spec.api_key_env} is not set")
    if not all(" " < ch <= "~" for ch in key):  # never in a header, so never in an error text either
        raise UserError(
            f"server.api_key_env: the value of {spec.api_key_env} has characters an HTTP header cannot "
            "carry (spaces, control or non-ASCII characters); the value is not shown"
        )
    if len(key) < MIN_KEY_CHARS:  # scrubbed wherever it appears: a key "x" renames every answer's "text" field
        raise UserError(
            f"server.api_key_env: the value of {spec.api_key_env} is shorter than {MIN_KEY_CHARS} "
            "characters: the key is scrubbed from everything the server sends back, and one this "
            "short would be found in ordinary answers (generated text, token ids) and change them; "
            "use a longer key (or none, with api_key_env unset)"
        )
    return key


def needs_logprobs(pre: Preflight) -> list[str]:
    """The run's tasks scored from prompt log-probabilities (every output type but generation)."""
    return [t.name for t in pre.tasks if t.name in pre.run_tasks and t.output_type not in GENERATION_TYPES]


def validate_tasks(pre: Preflight) -> None:
    """Attach mode: ask the server for prompt log-probabilities once, where a task needs them; a
    server that refuses them refuses those tasks here, in one line, before any setup runs."""
    cfg = pre.cfg
    spec = server_spec(cfg)
    api_key(cfg)  # an unset key variable: one line now, not a failed setup later
    wanted = needs_logprobs(pre)
    if spec.mode != "attach" or not wanted:
        return
    from qeval.backends.openai.client import Client, ServerError, Unreachable
    from qeval.backends.openai.scoring import probe_logprobs

    for setup in pre.setups:
        base_url, model = endpoint(cfg, setup)
        client = Client(base_url, api_key(cfg), timeout_s=min(spec.timeout_s, 60.0), retries=1)
        try:
            problem = probe_logprobs(client, model, spec.logprobs)
        except Unreachable as exc:
            raise UserError(f"setup {setup.name!r}: server {base_url} does not answer ({exc})") from None
        except ServerError as exc:
            problem = exc.message
        if problem:
            raise UserError(
                f"setup {setup.name!r}: server {base_url} refuses {spec.logprobs} log-probabilities "
                f"({problem}): likelihood task {wanted[0]!r} cannot be scored through it"
            )
