"""A tracking URI as it may be shown: credentials removed (docs/tracking.md, "Secrets").

A tracking URI is hostile input that may carry secrets in four places: the user, the password,
the query (`?token=...`, `?credential=...`, a presigned URL's signature) and the fragment. Guessing
which query parameters are secret by their names missed some (`credential=`), so every query value
and the whole fragment are treated as secrets: shown as `***`, and scrubbed from whatever a
tracker's client says back (which may quote them in another form: a request path, URL-encoded)."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

#: secrets shorter than this are scrubbed from messages only where they stand as `=value` or
#: `:value@` (a two-letter value replaced everywhere would mangle the message, and leaks nothing)
_SHORT = 3
#: the longest warning line a tracker's error may take
WARNING_CHARS = 300


def redact(uri: str) -> str:
    """`uri` with its user, password, every query value and its fragment replaced by `***`: what
    warnings and logs show. `https://user:pw@host/x?token=t&e=1#f` -> `https://***@host/x?token=***&e=***#***`."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URI at all: show nothing of it that could be a secret
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{pair.split('=', 1)[0]}=***" if "=" in pair else "***" for pair in parts.query.split("&") if pair
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, "***" if parts.fragment else ""))


def _secrets(uri: str) -> list[str]:
    """Every secret `uri` carries, in each form a client may quote it: raw, URL-decoded and
    URL-encoded; the longest first, so a secret inside another is replaced with it."""
    try:
        parts = urlsplit(uri)
        found = [parts.password or "", parts.username or "", parts.query, parts.fragment]
        found += [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
        found += [pair.split("=", 1)[1] for pair in parts.query.split("&") if "=" in pair]
    except ValueError:
        return [uri]
    forms = {form for secret in found if secret for form in (secret, unquote(secret), quote(secret, safe=""))}
    return sorted(forms, key=len, reverse=True)


def scrub(text: str, uri: str) -> str:
    """`text` (an error message from a tracker's client) with `uri` and every secret in it shown
    only as redact(uri) shows them, whatever form the client quoted them in."""
    out = text.replace(uri, redact(uri))
    for secret in _secrets(uri):
        if len(secret) >= _SHORT:
            out = out.replace(secret, "***")
        else:
            out = out.replace(f"={secret}", "=***").replace(f":{secret}@", ":***@")
    return out


def shorten(text: str, limit: int = WARNING_CHARS) -> str:
    """`text` cut to at most `limit` characters at a word's end, marked with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"
