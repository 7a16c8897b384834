"""Redaction of Ledger's own secrets from what untrusted commands print.

The cell (``ledger.sandbox.cell``) is why an attempt cannot print the worker's
database password: it cannot read it. This is the second line: before any
output of an attempt, an acceptance command or a sensor check is stored (the
journal, the attempt's log tail, a verdict's evidence, an observation), every
known secret value of Ledger's configuration is replaced by ``[redacted]``.

Known secrets: the password (and the whole URL) of every database URL Ledger
was given (``LEDGER_*DATABASE_URL``), libpq's ``PGPASSWORD``, the session
secret, the values of ``LEDGER_*`` variables whose name says SECRET, TOKEN,
PASSWORD or KEY, and the values an attempt environment passes on from
Ledger's own (an agent's API key printed by the agent is not kept either).
Values shorter than 6 characters are not redacted (they would match too much).

Output arrives in chunks; a secret split across two chunks is still caught:
the redactor holds back the end of a chunk for as long as it could be the
beginning of a secret, and releases it with the next chunk or at the end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit

from ledger.settings import inherited_environment

MARK = b"[redacted]"
_MIN = 6
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|KEY|CREDENTIAL", re.I)


def _url_secrets(url: str) -> list[str]:
    found = [url]
    try:
        parts = urlsplit(url)
        if parts.password:
            found += [parts.password, unquote(parts.password)]
    except ValueError:
        pass
    for match in re.finditer(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", url):
        found.append(match.group(1).strip("'"))
    return found


def known_secrets(environ: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> list[str]:
    """Every secret value this process knows of (see the module docstring)."""
    env = inherited_environment() if environ is None else environ
    found: list[str] = list(extra)
    for name, value in env.items():
        if not value:
            continue
        if name.startswith("LEDGER_") and name.endswith("DATABASE_URL"):
            found += _url_secrets(value)
        elif name == "PGPASSWORD" or (name.startswith("LEDGER_") and _SECRET_NAME.search(name)):
            found.append(value)
    return sorted({s for s in found if len(s) >= _MIN}, key=len, reverse=True)


class Redactor:
    """Replaces secrets in a stream of chunks (bytes)."""

    def __init__(self, secrets: Iterable[str]):
        values = sorted({s.encode() for s in secrets if len(s) >= _MIN}, key=len, reverse=True)
        self._secrets = values
        self._pattern = re.compile(b"|".join(re.escape(v) for v in values)) if values else None
        self._held = b""
        self.redacted = 0

    def feed(self, chunk: bytes) -> bytes:
        """The part of ``held + chunk`` that can be released, redacted."""
        if self._pattern is None:
            return chunk
        data = self._held + chunk
        data, n = self._pattern.subn(MARK, data)
        self.redacted += n
        keep = self._partial_suffix(data)
        self._held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep] if keep else data

    def flush(self) -> bytes:
        """Whatever is still held back (the stream ended)."""
        held, self._held = self._held, b""
        return held

    def _partial_suffix(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that begins a secret."""
        best = 0
        for secret in self._secrets:
            for k in range(min(len(secret) - 1, len(data)), best, -1):
                if data.endswith(secret[:k]):
                    best = k
                    break
        return best

    def text(self, text: str) -> str:
        """``text`` with every secret replaced (for a whole text at once)."""
        if self._pattern is None:
            return text
        raw, n = self._pattern.subn(MARK, text.encode("utf-8", "surrogateescape"))
        self.redacted += n
        return raw.decode("utf-8", "replace")


def redactor(extra: Iterable[str] = ()) -> Redactor:
    """A fresh redactor for this process's secrets (and ``extra`` values)."""
    return Redactor(known_secrets(extra=extra))
