"""Where the drills' own files are, for drills and tests that run them."""

from __future__ import annotations

from pathlib import Path


def scripted_attempt() -> Path:
    """The scripted attempt command shipped with the drills."""
    return Path(__file__).with_name("scripted_attempt.py")
