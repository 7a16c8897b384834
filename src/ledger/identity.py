"""Who a process is, as recorded on leases, attempts, verdicts and intents."""

from __future__ import annotations

import os
import secrets
import socket


def process_identity(role: str) -> str:
    """``role:host:pid:suffix`` -- unique per process start, readable in the
    journal, and says where to look when a claim is left behind. (The host is
    cut to 100 characters: identities are at most 200.)"""
    return f"{role}:{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(3)}"
