"""A tracking URI as it may be shown: credentials removed (docs/tracking.md, "Secrets")."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

#: query parameters whose values are secrets in the URIs trackers and databases accept
_SECRET_QUERY = re.compile(r"(?i)((?:password|passwd|pwd|token|secret|key|auth|signature|sig)[^=&]*=)[^&]*")


def redact(uri: str) -> str:
    """`uri` with any user, password and secret-looking query value replaced by `***`: what
    warnings and logs show. `https://user:pw@host/x?token=t` -> `https://***@host/x?token=***`."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URI at all: show nothing of it that could be a secret
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = _SECRET_QUERY.sub(r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, uri: str) -> str:
    """`text` (an error message from a tracker's client) with `uri` and its credentials shown
    only as redact(uri) shows them."""
    shown = redact(uri)
    out = text.replace(uri, shown)
    parts = urlsplit(uri) if "://" in uri else None
    if parts is not None and parts.password:
        out = out.replace(parts.password, "***")
    if parts is not None and parts.username:
        out = out.replace(f"{parts.username}@", "***@")
    return out
