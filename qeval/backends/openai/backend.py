"""The openai backend: one setup scored through an OpenAI-compatible server's API, attached to
(`server.mode: attach`) or launched for the setup and stopped after it (`launch`).

Requests go out `server.concurrency` at a time; each is one prompt as token ids
(qeval/backends/openai/scoring.py), so the server's scores are the in-process vllm backend's
for the same engine settings, document by document.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.backends.base import GenerateRequest, MemoryFigure, Progress
from qeval.backends.openai import metrics, scoring
from qeval.backends.openai.client import Client, ServerError, Unreachable
from qeval.backends.openai.launch import HOST, LaunchedServer, free_port
from qeval.backends.openai.support import DEFAULT_SERVED_NAME, api_key, endpoint, serve_argv, server_spec
from qeval.backends.tokens import conventions, generation_context
from qeval.backends.windowed import Prompt, WindowedBackend
from qeval.config import RunConfig
from qeval.config.setups import Setup

if TYPE_CHECKING:
    from qeval.backends.workload import Measurement, Workload


class OpenAIBackend(WindowedBackend):
    """Serves one Setup through an OpenAI-compatible server."""

    name = "openai"

    def __init__(self, cfg: RunConfig, setup: Setup, device: str) -> None:
        super().__init__(cfg, setup, device)
        self.spec = server_spec(cfg)
        self.server: LaunchedServer | None = None
        self.client: Client | None = None
        self.model = self.spec.model or DEFAULT_SERVED_NAME
        self._scratch: Path | None = None
        self._engine_args: dict[str, Any] = {}
        self._argv: list[str] = []
        self._version: str | None = None
        #: the most characters one generated token can decode to (token_chars): bounds a generation's text
        self._token_chars = 0

    def load(self) -> None:
        key = api_key(self.cfg)
        if self.spec.mode == "launch":
            port = free_port()
            self._argv, self._engine_args = serve_argv(self.cfg, self.setup, self.device, port, HOST)
            self._scratch = Path(tempfile.mkdtemp(prefix="qeval-server-"))
            # the key reaches vLLM through its environment (VLLM_API_KEY), never its command line or log
            self.server = LaunchedServer(self._argv, {"VLLM_API_KEY": key} if key else {}, self._scratch / "server.log")
            base_url = f"http://{HOST}:{port}/v1"
        else:
            base_url, self.model = endpoint(self.cfg, self.setup)
        s = self.spec
        self.client = Client(
            base_url,
            key,
            s.timeout_s,
            s.retries,
            s.backoff_s,
            before_retry=self.server.check_alive if self.server else None,
        )
        if self.server is not None:
            self.server.wait_healthy(self.client.healthy, s.startup_timeout_s)
            if not self.server.listens_on(port):
                self.server.failed = True
                raise RuntimeError(
                    f"port {port} answered GET /health, but not from the launched server's processes "
                    "(another process took the port first); rerun to launch it on another port"
                )
        elif not self.client.healthy(timeout=min(s.timeout_s, 30.0)):
            self.client.get_text("/models", root=False)  # no /health: the API itself must answer (or raise)
        from transformers import AutoTokenizer

        # the served folder's tokenizer, as the in-process engine uses the folder it loads
        served = self.spec.mode == "launch" and self.setup.checkpoint
        folder = self.setup.checkpoint if served else self.cfg.model.path
        revision = self.setup.checkpoint_revision if served else self.cfg.model.revision  # as the server pins it
        self.tok = AutoTokenizer.from_pretrained(
            folder, revision=revision, trust_remote_code=self.cfg.model.trust_remote_code
        )
        self.conv = conventions(self.tok)
        self._token_chars = token_chars(self.tok)
        self._version = _server_version(self.client)

    def close(self) -> None:
        died = self.server is not None and (self.server.died or self.server.failed)
        if self.server is not None:
            self.server.stop()
        if self._scratch is not None and not died:  # a server that died keeps its log (named in the error)
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _post(self, body: dict[str, Any]) -> Any:
        assert self.client is not None
        try:  # the answer bounded by what the request can need (a 60 MB answer is refused, not read whole)
            return self.client.post("/completions", body, scoring.answer_bytes(body))
        except (Unreachable, ServerError) as exc:
            if self.server is None or (isinstance(exc, ServerError) and exc.status < 500):
                raise
            # a launched server that stops answering is usually dying (vLLM's API server shuts down
            # after its engine core fails): name its death and the engine's error, not the symptom
            self.server.wait_exit(15)
            self.server.check_alive()
            raise

    def _scored(self, prompts: list[Prompt], progress: Progress | None) -> list[tuple[Any, ...]]:
        """Window arrays of each (prompt, start, n), `server.concurrency` requests in flight."""
        assert self.client is not None
        mode = self.spec.logprobs
        return self.client.map(
            lambda p: scoring.score_prompt(self._post, self.model, p[0], mode, p[1], p[2]),
            prompts,
            self.spec.concurrency,
            progress,
        )

    def generate(self, requests: list[GenerateRequest], progress: Progress) -> list[str]:
        assert self.client is not None

        def one(r: GenerateRequest) -> str:
            ids = generation_context(self.conv.prompt(r.context), self.max_length, r.max_gen_toks)
            return scoring.generation(
                self._post(scoring.generate_body(self.model, ids, r)),
                r.max_gen_toks,
                r.max_gen_toks * self._token_chars,
            )

        return self.client.map(one, requests, self.spec.concurrency, progress)

    @property
    def concurrency_limit(self) -> int | None:
        """A launched vLLM's max_num_seqs where the config sets it; otherwise the server's own, unknown here."""
        return self.cfg.engine.max_num_seqs if self.spec.mode == "launch" and not self.spec.command else None

    def performance(self, workload: Workload) -> Measurement:
        """Streaming requests per concurrency level (qeval/backends/openai/perf.py)."""
        from qeval.backends.openai import perf
        from qeval.backends.vllm.perf import engine_threads_note

        m = perf.measure(self.client, self.model, self.tok, workload)
        note = engine_threads_note(self.server.log_text()) if self.server else None
        if note:
            m.notes.append(note)
        return m

    def memory(self) -> dict[str, MemoryFigure]:
        """The server's /metrics (KV pool), its log where qeval launched vLLM (KV bytes per token),
        and the resident memory of the launched server's process tree."""
        assert self.client is not None
        from qeval.backends.vllm.logs import parse_engine_log

        try:
            text: str | None = self.client.get_text("/metrics", timeout=30)
        except RuntimeError:
            text = None
        figures = metrics.server_figures(text, self.max_length)
        if text is None:
            figures["kv_cache_tokens"] = metrics.not_measured("the server has no Prometheus /metrics")
        found = parse_engine_log(self.server.log_text()) if self.server else {}
        kv, tokens = found.get("kv_cache_gib"), found.get("kv_cache_tokens")
        figures["kv_bytes_per_token"] = (
            MemoryFigure(
                round(kv["value"] / tokens["value"]),
                "launched vLLM server's log: KV cache GiB / KV cache tokens (GiB rounded to 0.01 in the log)",
                lines=[kv["line"], tokens["line"]],
            )
            if kv and tokens
            else metrics.not_measured("the server reports no KV bytes per token")
        )
        w = found.get("weights_gib")
        figures["weights_bytes"] = (
            MemoryFigure(w["value"], "launched vLLM server's log: 'Model loading took'")
            if w
            else metrics.not_measured("the server reports no weight size")
        )
        rss = metrics.tree_rss(self.server.pid) if self.server else None
        figures["peak_bytes"] = (
            MemoryFigure(rss, "RSS of the launched server's process tree (psutil, after scoring)")
            if rss
            else metrics.not_measured(
                "an attached server's processes are not qeval's" if not self.server else "the launched server is gone"
            )
        )
        return figures

    @property
    def quant_info(self) -> dict[str, Any]:
        """The server (mode, model, launch command and the engine arguments it came from), the
        checkpoint's description, and the kernels a launched vLLM logged for it."""
        from qeval.backends.vllm.logs import served_checkpoint_info

        server: dict[str, Any] = {"mode": self.spec.mode, "model": self.model}
        if self.client is not None:
            server["base_url"] = self.client.base_url
        if self._argv:
            server["argv"] = self._argv
        info: dict[str, Any] = {"server": server}
        if self._engine_args and "command" not in self._engine_args:
            info["engine_args"] = self._engine_args
        served = self.setup.checkpoint if self.spec.mode == "launch" else None  # an attached server's is unknown
        log = self.server.log_text() if self.server else ""
        return info | served_checkpoint_info(served, self.setup.checkpoint_revision, log)

    def library_versions(self) -> dict[str, str]:
        from importlib.metadata import version

        libs = {"transformers": version("transformers")}
        if self._version:
            libs["server"] = self._version
        return libs


#: the longest server version stored (vLLM's are like 0.32.0 or 0.11.1rc2.dev45+g1234567.cpu)
MAX_VERSION_CHARS = 64


def _server_version(client: Client) -> str | None:
    """The server's version where it says it (vLLM and SGLang: GET /version), as printable
    characters cut to MAX_VERSION_CHARS: it goes into results.json and the report."""
    import json

    try:
        data = json.loads(client.get_text("/version", timeout=10, max_bytes=64 * 2**10))
    except (RuntimeError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("version"), (str, int, float)):
        return None
    text = "".join(ch for ch in str(data["version"]) if ch.isprintable()).strip()
    if len(text) > MAX_VERSION_CHARS:
        text = text[: MAX_VERSION_CHARS - 1] + "…"
    return text or None


def token_chars(tok: Any) -> int:
    """The most characters one token can decode to, from the tokenizer's vocabulary, doubled
    with room for a space a decoder puts between tokens: no generated text of n tokens is
    longer than n times it (a byte-level token's string has one character per byte)."""
    try:
        longest = max(map(len, tok.get_vocab()), default=0)
    except (AttributeError, TypeError, NotImplementedError):  # a tokenizer without a vocabulary map
        longest = 64
    return 2 * (max(longest, 16) + 1)
