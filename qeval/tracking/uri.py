"""A tracking URI as it may be shown: credentials removed (docs/tracking.md, "Secrets").

A tracking URI is hostile input that may carry secrets in four places: the user, the password,
the query (`?token=...`, `?credential=...`, a presigned URL's signature) and the fragment. Guessing
which query parameters are secret by their names missed some (`credential=`), so every query value
and the whole fragment are treated as secrets: shown as `***`, and scrubbed from whatever a
tracker's client says back (which may quote them in another form: a request path, URL-encoded).
The userinfo is everything between `//` and the last `@`: a password may hold `/`, `?` or `#`,
where `urlsplit` ends the authority (issue 54)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

#: secrets shorter than this are scrubbed from messages only where they stand as `=value` or
#: `:value@` (a two-letter value replaced everywhere would mangle the message, and leaks nothing)
_SHORT = 3
#: the longest warning line a tracker's error may take
WARNING_CHARS = 300
#: what a host[:port] (or an IPv6 literal) may be made of; anything else is not shown
_HOST = re.compile(r"[A-Za-z0-9.\-_~%\[\]:]*")
#: a URI's start up to its authority: `scheme://`, or `//` alone
_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*:)?//")
#: where a URI parser may cut a secret into pieces, each of which a client may quote alone
_CUTS = re.compile(r"[/?#:@&=;]")


def _userinfo(uri: str) -> tuple[str, str | None, str]:
    """(`scheme://`, `//` or "", the userinfo or None, the rest): the userinfo is everything
    between `//` and the LAST `@`, whatever it holds. A password may hold `/`, `?` or `#`, where
    `urlsplit` would end the authority and show the rest of it as the host, path or fragment."""
    authority = _AUTHORITY.match(uri)
    head = authority.group(0) if authority else ""
    rest = uri[len(head) :]
    if "@" not in rest:
        return head, None, rest
    userinfo, host = rest.rsplit("@", 1)
    return head, userinfo, host


def redact(uri: str) -> str:
    """`uri` with its user, password, every query value and its fragment replaced by `***`: what
    warnings and logs show. `https://user:pw@host/x?token=t&e=1#f` -> `https://***@host/x?token=***&e=***#***`;
    `http://key:pa/ss#w@host` -> `http://***@host` (the userinfo ends at the last `@`)."""
    try:
        head, userinfo, rest = _userinfo(uri)
        parts = urlsplit("//" + rest if head or userinfo is not None else rest)
    except ValueError:  # not a URI at all: show nothing of it that could be a secret
        return "***"
    query = "&".join(
        f"{pair.split('=', 1)[0]}=***" if "=" in pair else "***" for pair in parts.query.split("&") if pair
    )
    if not head and userinfo is None:  # no authority (sqlite:relative.db, a path)
        return urlunsplit((parts.scheme, "", parts.path, query, "***" if parts.fragment else ""))
    netloc = parts.netloc if _HOST.fullmatch(parts.netloc) else "***"
    shown = head + ("***@" if userinfo is not None else "") + netloc + parts.path
    shown += (f"?{query}" if query else "") + ("#***" if parts.fragment else "")
    return _scrubbed(shown, uri)


def _secrets(uri: str) -> list[str]:
    """Every secret `uri` carries, in each form a client may quote it: raw, URL-decoded and
    URL-encoded, and cut where a URI parser may cut it; the longest first, so a secret inside
    another is replaced with it. The userinfo is read both as qeval reads it (up to the last `@`)
    and as `urlsplit` does, since a client may use either."""
    found: list[str] = []
    try:
        head, userinfo, rest = _userinfo(uri)
        readings = [urlsplit(uri)]
        if userinfo is not None:
            found += [userinfo, *userinfo.split(":", 1), *_CUTS.split(userinfo)]
            readings.append(urlsplit("//" + rest))
        for parts in readings:
            found += [parts.password or "", parts.username or "", parts.query, parts.fragment]
            found += [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
            found += [pair.split("=", 1)[1] for pair in parts.query.split("&") if "=" in pair]
    except ValueError:
        return [uri]
    forms = {form for secret in found if secret for form in (secret, unquote(secret), quote(secret, safe=""))}
    return sorted(forms, key=len, reverse=True)


def _scrubbed(text: str, uri: str) -> str:
    """`text` with every secret of `uri` replaced by `***`."""
    for secret in _secrets(uri):
        if len(secret) >= _SHORT:
            text = text.replace(secret, "***")
        else:
            text = text.replace(f"={secret}", "=***").replace(f":{secret}@", ":***@")
    return text


def scrub(text: str, uri: str) -> str:
    """`text` (an error message from a tracker's client) with `uri` and every secret in it shown
    only as redact(uri) shows them, whatever form the client quoted them in."""
    return _scrubbed(text.replace(uri, redact(uri)), uri)


def shorten(text: str, limit: int = WARNING_CHARS) -> str:
    """`text` cut to at most `limit` characters at a word's end, marked with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"
