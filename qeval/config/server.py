"""The OpenAI-compatible server's piece of the run config (`server:`, the `openai` backend).

Two modes: `attach` to a server someone already runs (`base_url`, `model`), or `launch` one
per setup (`vllm serve` from the setup's translated engine arguments, or `command`, a template
for another server such as SGLang). Only the *name* of the API key's environment variable is
in the config: the key itself is read from the environment in the worker and written nowhere.
"""

from __future__ import annotations

import ipaddress
import string
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from qeval.strict import Strict

#: the placeholders a launch `command` may use (filled by qeval/backends/openai/support.py)
COMMAND_FIELDS = ("model", "host", "port", "served_model_name", "dtype", "max_model_len")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def base_url_problem(url: str) -> str | None:
    """Why `url` is not a base URL qeval sends requests to (None when it is): http or https, a
    host, no credentials (they would be written to results.json with the config), no query or
    fragment (qeval appends the endpoint paths itself)."""
    if any(ch in url for ch in "?#") or any(ch.isspace() or not ch.isprintable() for ch in url):
        # urlsplit drops an empty query or fragment and strips whitespace: http://h/v1? would pass
        # and then send every request to /v1?/completions
        return f"base_url {url!r} must not have a query or fragment, spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"base_url {url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"base_url {url!r} must start with http:// or https://"
    if not parts.hostname:
        return f"base_url {url!r} names no host"
    if parts.username is not None or parts.password is not None:
        return "base_url must not carry credentials (user:password@); name the key's variable in api_key_env"
    if parts.query or parts.fragment:
        return f"base_url {url!r} must not have a query or fragment"
    if port == 0:
        return f"base_url {url!r}: port 0 is not a port"
    return None


def is_loopback(host: str) -> bool:
    """`host` names this machine by itself: localhost or a loopback address literal. Decided
    from the text alone: no name is resolved (that would reach out before the refusal, and a
    resolver can answer anything)."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecure_key_problem(base_url: str | None, api_key_env: str | None, allowed: bool) -> str | None:
    """Why a Bearer key would travel in clear to another machine (None when it would not):
    plain http to a host that is not loopback, unless the config says so."""
    if base_url is None or api_key_env is None or allowed:
        return None
    parts = urlsplit(base_url)
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return None
    return (
        f"server: the API key ({api_key_env}) would be sent in clear over plain http to {parts.hostname}; "
        "use https, or set server.allow_insecure_key: true if that is intended"
    )


class ServerSpec(Strict):
    """How the `openai` backend reaches its server (docs/backends.md, "OpenAI-compatible servers")."""

    mode: Literal["attach", "launch"] = "launch"
    #: attach: the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1
    base_url: str | None = None
    #: the served model name sent as `model` (attach: required; launch: vllm serve's --served-model-name)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    #: the environment variable holding the API key (sent as a Bearer token; launch: handed to
    #: vLLM as VLLM_API_KEY through the environment, never on its command line)
    api_key_env: str | None = Field(default=None, pattern=_ENV_NAME)
    #: send the key over plain http to a host that is not loopback (refused unless true: anyone
    #: on the path reads it)
    allow_insecure_key: bool = False
    #: launch another server than vLLM: an argv template with {model} {host} {port}
    #: {served_model_name} {dtype} {max_model_len}; None: vLLM's OpenAI server from the engine table
    command: list[str] | None = Field(default=None, min_length=1)
    #: requests in flight at once while scoring
    concurrency: int = Field(default=8, gt=0, le=256)
    #: seconds one request may take before it is retried
    timeout_s: float = Field(default=300.0, gt=0)
    #: retries of a request that failed to connect, timed out, or got 429 / 5xx (exponential backoff)
    retries: int = Field(default=3, ge=0, le=10)
    backoff_s: float = Field(default=0.5, ge=0)
    #: launch: seconds to wait for GET /health
    startup_timeout_s: float = Field(default=600.0, gt=0)
    #: how log-likelihoods are asked for: vLLM's `prompt_logprobs` extra parameter, or the
    #: OpenAI legacy `echo` + `logprobs` (token ids through vLLM's `return_tokens_as_token_ids`)
    logprobs: Literal["prompt_logprobs", "echo"] = "prompt_logprobs"

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            problem = base_url_problem(value)
            if problem:
                raise ValueError(problem)
            return value.rstrip("/")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        for part in value or []:
            try:  # what str.format will read: a lone brace fails here, not in the worker
                names = [name for _, name, _, _ in string.Formatter().parse(part) if name is not None]
            except ValueError as exc:
                raise ValueError(f"command: {part!r}: {exc} (a literal brace is written {{{{ or }}}})") from None
            for name in names:
                if name not in COMMAND_FIELDS:
                    raise ValueError(
                        f"command: unknown placeholder {{{name}}} (known: "
                        f"{', '.join('{' + f + '}' for f in COMMAND_FIELDS)})"
                    )
        return value

    @model_validator(mode="after")
    def _check(self) -> ServerSpec:
        if self.mode == "attach":
            if self.base_url is None or self.model is None:
                raise ValueError("server: attach needs base_url and model (the served model name)")
            if self.command is not None:
                raise ValueError("server: command applies to mode launch only")
        elif self.base_url is not None:
            raise ValueError("server: base_url applies to mode attach only (launch picks a free port on 127.0.0.1)")
        problem = insecure_key_problem(self.base_url, self.api_key_env, self.allow_insecure_key)
        if problem:  # at config load: before validate or run opens any connection
            raise ValueError(problem)
        return self
