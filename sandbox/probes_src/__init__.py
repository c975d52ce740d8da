"""Probe programs run inside and outside the sandbox by ``sbx verify`` and the tests.

They are plain scripts run as ``python3 -I -S -c SOURCE``; ``source(name)`` reads one.
"""

from __future__ import annotations

from pathlib import Path


def source(name: str) -> str:
    return (Path(__file__).resolve().parent / f"{name}.py").read_text(encoding="utf-8")
