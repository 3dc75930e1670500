"""HTTP to an OpenAI-compatible server: JSON requests with timeouts and retries (exponential
backoff on connection errors, timeouts, 429 and 5xx), server-sent-event streams, and a batch
of requests spread over a thread pool of `concurrency` connections.

Written on the standard library (`urllib.request`, `concurrent.futures`): the worker runs in
qeval's own environment, which has no HTTP client package (httpx is only in .venv-vllm), and
one blocking request per thread is all scoring needs. The API key is held in memory only and
sent as a Bearer header; no message this module raises contains it.

Everything a server sends back is untrusted. It is read in bounded pieces (an answer over its
request's bound is refused before the rest is read: `TooLarge`), and the key is scrubbed from
it (`Client.scrub`: the key in every form a server may echo it, `Bearer <key>` included) before
anything else sees it: the decoded JSON of an answer, its text, an error body, a redirect's
target and http.client's own messages (a bad status line quotes what the server sent).
"""

from __future__ import annotations

import functools
import html
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: HTTP statuses worth another try: the server is busy or restarting, not refusing the request
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: the most bytes of an answer whose request sets no bound of its own (GET /version, /metrics,
#: /models): vLLM's /metrics is about 100 KB
MAX_ANSWER_BYTES = 8 * 2**20
#: the bytes of an error answer read for its message (the message shown is cut to 300 characters)
MAX_ERROR_BYTES = 64 * 2**10
#: the longest line of a server-sent event stream (one event: a few hundred bytes from vLLM)
MAX_EVENT_BYTES = 2**20
#: what stands where a server echoed the key
REDACTED = "[redacted]"
#: bytes read at a time: the answer is never held beyond its bound plus one piece
_PIECE = 2**16


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would resend the Authorization header to whatever host
    a 30x names (https to http included) and turn the POST into a GET."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(
            req.full_url, code, f"redirected to {newurl}; set base_url to the final URL", headers, fp
        )


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


class BadAnswer(RuntimeError):
    """An answer that cannot be true (larger than its request allows, log-probs above 0 or not
    finite, a negative token count, a text longer than its tokens can spell): the setup fails
    with it, as with any server error; nothing of the answer is stored."""


class TooLarge(BadAnswer):
    """An answer over its request's byte bound, refused before the rest of it is read."""


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
                # the message scrubbed before it is cut to 300 characters: a cut key would pass the scrub
                err = ServerError(url, exc.code, self.scrub(_message(exc, self.timeout_s))[:300])
                if exc.code not in RETRY_STATUSES:
                    raise err from None
                last = err
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as exc:
                # http.client's own errors quote what the server sent (BadStatusLine: its status line)
                last = Unreachable(f"{url}: {self.scrub(str(getattr(exc, 'reason', exc)))[:300]}")
        assert last is not None
        raise last

    def scrub(self, text: str) -> str:
        """`text` with the API key replaced, in every form a server may echo it: as sent (so
        `Bearer <key>` too), URL-encoded, HTML-escaped and JSON-escaped. Scrub a text before
        cutting it short: a key cut in two passes the scrub."""
        if not self.api_key:
            return text
        for form in _key_forms(self.api_key):
            text = text.replace(form, REDACTED)
        return text

    def _scrub_answer(self, raw: bytes, data: Any) -> Any:
        """The decoded answer with the key scrubbed from every string in it, keys of maps
        included. Walked only where it could be there: without a backslash in the raw bytes
        every decoded string is spelled in them as it is, so an absent key is absent."""
        if not self.api_key or (b"\\" not in raw and not any(f.encode() in raw for f in _key_forms(self.api_key))):
            return data
        return _walk(data, self.scrub)

    def _read(self, resp: Any, url: str, limit: int) -> bytes:
        """The whole body of `resp`, read in pieces; TooLarge past `limit` bytes (a declared
        Content-Length over it is refused before anything is read)."""
        declared = resp.headers.get("Content-Length") if getattr(resp, "headers", None) is not None else None
        if declared and declared.strip().isdigit() and int(declared) > limit:
            raise TooLarge(
                f"{url}: the answer is {int(declared):,} bytes, more than the {limit:,} this request "
                "can need; refused unread"
            )
        pieces: list[bytes] = []
        total = 0
        # timeout_s bounds each socket read; a server trickling its answer a byte at a time would
        # never trip it: the whole answer must arrive within timeout_s too
        deadline = time.monotonic() + self.timeout_s
        # read1: what has arrived (one read of the socket), where read(n) waits until n bytes are in
        read = getattr(resp, "read1", None) or resp.read
        while True:
            piece = read(min(_PIECE, limit + 1 - total))
            if not piece:
                return b"".join(pieces)
            if time.monotonic() > deadline:
                raise Unreachable(
                    f"{url}: the answer took more than {self.timeout_s:g} s to arrive "
                    "(server.timeout_s); refused (the rest was not read)"
                )
            pieces.append(piece)
            total += len(piece)
            if total > limit:
                raise TooLarge(
                    f"{url}: the answer is more than the {limit:,} bytes this request can need; "
                    "refused (the rest was not read)"
                )

    def post(self, path: str, body: dict[str, Any], max_bytes: int = MAX_ANSWER_BYTES) -> Any:
        """POST `body` as JSON to base_url + path; the decoded JSON answer, the key scrubbed from
        it (a ServerError for a 200 whose body is not JSON, or carries an `error`; Unreachable
        for one cut off; TooLarge for one over `max_bytes`)."""
        url = self.base_url + path
        try:
            with self._open(url, body) as resp:
                raw = self._read(resp, url, max_bytes)
        except (http.client.HTTPException, TimeoutError, ConnectionError) as exc:  # the body cut off mid-read
            raise Unreachable(f"{url}: the answer was cut off ({type(exc).__name__})") from None
        try:
            data = self._scrub_answer(raw, json.loads(raw))
        except (ValueError, RecursionError):  # RecursionError: an answer nested thousands deep
            text = self.scrub(raw.decode(errors="replace")).strip()
            raise ServerError(url, 200, "not JSON: " + text[:300]) from None
        if isinstance(data, dict) and data.get("error"):
            err = data["error"]
            raise ServerError(url, 200, str(err.get("message", err) if isinstance(err, dict) else err)[:300])
        return data

    def get_text(
        self, path: str, *, root: bool = True, timeout: float | None = None, max_bytes: int = MAX_ANSWER_BYTES
    ) -> str:
        """GET root (or base_url) + path as text (/health, /metrics), at most `max_bytes`, the key scrubbed."""
        url = (self.root if root else self.base_url) + path
        try:
            with self._open(url, None, timeout) as resp:
                raw = self._read(resp, url, max_bytes)
        except (http.client.HTTPException, TimeoutError, ConnectionError) as exc:
            raise Unreachable(f"{url}: the answer was cut off ({type(exc).__name__})") from None
        return self.scrub(raw.decode(errors="replace"))

    def healthy(self, timeout: float = 5.0) -> bool:
        """GET /health answers 200, once, no retries."""
        try:
            with _OPENER.open(self._request(self.root + "/health", None, timeout), timeout=timeout) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, ValueError, http.client.HTTPException):
            return False

    def stream(
        self, path: str, body: dict[str, Any], max_bytes: int = MAX_ANSWER_BYTES
    ) -> Iterator[tuple[float, dict[str, Any]]]:
        """POST a streaming request; each server-sent event as (perf_counter at arrival, its JSON,
        the key scrubbed). A line over MAX_EVENT_BYTES, a stream over `max_bytes` or an event
        that is not a JSON object is a BadAnswer."""
        url = self.base_url + path
        total = 0
        with self._open(url, body | {"stream": True}) as resp:
            while True:
                raw = resp.readline(MAX_EVENT_BYTES + 1)
                if not raw:
                    return
                total += len(raw)
                if len(raw) > MAX_EVENT_BYTES or total > max_bytes:
                    raise TooLarge(
                        f"{url}: the stream is larger than this request can need (an event line over "
                        f"{MAX_EVENT_BYTES:,} bytes, or over {max_bytes:,} bytes in all); refused"
                    )
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    return
                try:
                    event = self._scrub_answer(raw, json.loads(data))
                except (ValueError, RecursionError):
                    raise BadAnswer(f"{url}: a streamed event is not JSON") from None
                if not isinstance(event, dict):
                    raise BadAnswer(f"{url}: a streamed event is not a JSON object")
                yield time.perf_counter(), event

    def map(
        self, fn: Callable[[T], R], items: list[T], concurrency: int, done: Callable[[int], None] | None = None
    ) -> list[R]:
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


@functools.lru_cache(maxsize=8)
def _key_forms(key: str) -> tuple[str, ...]:
    """The key as a server may echo it: as sent, URL-encoded, HTML-escaped, JSON-escaped."""
    escaped = json.dumps(key)[1:-1]
    forms = {
        key,
        urllib.parse.quote(key, safe=""),
        urllib.parse.quote_plus(key, safe=""),
        html.escape(key),
        escaped,
        escaped.replace("/", "\\/"),
    }  # JSON may escape a slash: \/
    return tuple(sorted(forms, key=len, reverse=True))  # the longest first: no form is left half replaced


def _walk(data: Any, scrub: Callable[[str], str]) -> Any:
    """`data` (decoded JSON) with `scrub` applied to every string, keys of maps included."""
    if isinstance(data, str):
        return scrub(data)
    if isinstance(data, dict):
        return {scrub(k): _walk(v, scrub) for k, v in data.items()}
    if isinstance(data, list):
        return [_walk(v, scrub) for v in data]
    return data


def _error_body(exc: urllib.error.HTTPError, timeout_s: float) -> bytes:
    """An error answer's first MAX_ERROR_BYTES, read as they arrive for at most `timeout_s`: a
    body trickled a byte at a time is cut there (read(n) would wait for all n bytes)."""
    fp = getattr(exc, "fp", None)
    read = getattr(fp, "read1", None) or exc.read
    deadline = time.monotonic() + timeout_s
    pieces: list[bytes] = []
    total = 0
    while total < MAX_ERROR_BYTES and time.monotonic() <= deadline:
        piece = read(MAX_ERROR_BYTES - total)
        if not piece:
            break
        pieces.append(piece)
        total += len(piece)
    return b"".join(pieces)


def _message(exc: urllib.error.HTTPError, timeout_s: float = 30.0) -> str:
    """The server's error message: its JSON `error.message` / `message` / `detail`, else the body
    (its first MAX_ERROR_BYTES, within `timeout_s`: an error answer is read no further). Not cut
    to length here: the caller scrubs it first."""
    try:
        body = _error_body(exc, timeout_s).decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return str(exc.reason or "")
    if not body.strip():  # no body: the status's own reason (a refused redirect says where it went)
        return str(exc.reason or "")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body.strip()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail"):
            if data.get(key):
                return str(data[key])
    return body.strip()
