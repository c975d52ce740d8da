"""Enforcement tiers, ordered weakest to strongest."""

from __future__ import annotations

import enum

from .errors import UsageError


class Tier(enum.IntEnum):
    EnvironmentOnly = 0
    KernelSeccompOnly = 1
    KernelFull = 2

    def __str__(self) -> str:
        return self.name

    @property
    def uses_bwrap(self) -> bool:
        return self >= Tier.KernelSeccompOnly

    @property
    def uses_seccomp(self) -> bool:
        return self >= Tier.KernelSeccompOnly

    @property
    def uses_landlock(self) -> bool:
        return self >= Tier.KernelFull

    @classmethod
    def parse(cls, name: str) -> Tier:
        for tier in cls:
            if tier.name.lower() == name.strip().lower():
                return tier
        names = ", ".join(t.name for t in cls)
        raise UsageError(f"unknown tier {name!r}", f"use one of: {names}")
