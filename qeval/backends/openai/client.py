"""HTTP to an OpenAI-compatible server: JSON requests with timeouts and retries (exponential
backoff on connection errors, timeouts, 429 and 5xx), server-sent-event streams, and a batch
of requests spread over a thread pool of `concurrency` connections.

Written on the standard library (`urllib.request`, `concurrent.futures`): the worker runs in
qeval's own environment, which has no HTTP client package (httpx is only in .venv-vllm), and
one blocking request per thread is all scoring needs. The API key is held in memory only and
sent as a Bearer header; no message this module raises contains it.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: HTTP statuses worth another try: the server is busy or restarting, not refusing the request
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would resend the Authorization header to whatever host
    a 30x names (https to http included) and turn the POST into a GET."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirected to {newurl}; set base_url to the final URL",
                                     headers, fp)


#: the one opener every request goes through: no proxy (urlopen honours http_proxy even for
#: 127.0.0.1, and the Bearer key would travel through it in clear) and no redirects
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


class ServerError(RuntimeError):
    """A request the server answered with an error status (after any retries): `status`, and
    the server's own message (its JSON `error.message` where it gave one)."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.status, self.message = status, message


class Unreachable(RuntimeError):
    """The server did not answer (refused, reset, timed out) after every retry."""


@dataclass
class Client:
    """One server's API: `base_url` (e.g. http://127.0.0.1:8000/v1) and its root (/health,
    /metrics sit beside /v1 on vLLM and SGLang)."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0
    retries: int = 3
    backoff_s: float = 0.5
    #: called before each retry (the launcher checks that its server still runs: a dead one is
    #: named as the cause instead of a connection error after every retry)
    before_retry: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def root(self) -> str:
        """The server's root URL: base_url without a trailing /v1."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def _request(self, url: str, body: dict[str, Any] | None, timeout: float) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")

    def _open(self, url: str, body: dict[str, Any] | None, timeout: float | None = None) -> Any:
        """The open response of one request, retried with backoff; ServerError / Unreachable after."""
        timeout = timeout or self.timeout_s
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                if self.before_retry is not None:
                    self.before_retry()
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return _OPENER.open(self._request(url, body, timeout), timeout=timeout)
            except urllib.error.HTTPError as exc:
                err = ServerError(url, exc.code, _message(exc))
                if exc.code not in RETRY_STATUSES:
                    raise err from None
                last = err
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = Unreachable(f"{url}: {getattr(exc, 'reason', exc)}")
        assert last is not None
        raise last

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST `body` as JSON to base_url + path; the decoded JSON answer (a ServerError for a
        200 whose body is not JSON, or carries an `error`, or is cut off)."""
        url = self.base_url + path
        try:
            with self._open(url, body) as resp:
                raw = resp.read()
        except (http.client.HTTPException, TimeoutError, ConnectionError) as exc:  # the body cut off mid-read
            raise Unreachable(f"{url}: the answer was cut off ({type(exc).__name__})") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise ServerError(url, 200, "not JSON: " + raw[:300].decode(errors="replace").strip()) from None
        if isinstance(data, dict) and data.get("error"):
            err = data["error"]
            raise ServerError(url, 200, str(err.get("message", err) if isinstance(err, dict) else err)[:300])
        return data

    def get_text(self, path: str, *, root: bool = True, timeout: float | None = None) -> str:
        """GET root (or base_url) + path as text (/health, /metrics)."""
        with self._open((self.root if root else self.base_url) + path, None, timeout) as resp:
            return str(resp.read().decode())

    def healthy(self, timeout: float = 5.0) -> bool:
        """GET /health answers 200, once, no retries."""
        try:
            with _OPENER.open(self._request(self.root + "/health", None, timeout), timeout=timeout) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, ValueError):
            return False

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[tuple[float, dict[str, Any]]]:
        """POST a streaming request; each server-sent event as (perf_counter at arrival, its JSON)."""
        with self._open(self.base_url + path, body | {"stream": True}) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                yield time.perf_counter(), json.loads(data)

    def map(self, fn: Callable[[T], R], items: list[T], concurrency: int,
            done: Callable[[int], None] | None = None) -> list[R]:
        """fn over items with `concurrency` in flight, results in order; the first failure raises."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(concurrency, len(items))) as pool:
            futures = [pool.submit(fn, item) for item in items]
            out = []
            try:
                for fut in futures:
                    out.append(fut.result())
                    if done is not None:
                        done(1)
            except BaseException:
                for fut in futures:  # a dead server: the queued requests are not sent at all
                    fut.cancel()
                raise
            return out


def _message(exc: urllib.error.HTTPError) -> str:
    """The server's error message: its JSON `error.message` / `message` / `detail`, else the body."""
    try:
        body = exc.read().decode(errors="replace")
    except OSError:
        return exc.reason or ""
    if not body.strip():  # no body: the status's own reason (a refused redirect says where it went)
        return str(exc.reason or "")
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        for key in ("message", "detail"):
            if data.get(key):
                return str(data[key])[:300]
    return body.strip()[:300]
