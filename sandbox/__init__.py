"""sbx: run untrusted commands in a bubblewrap sandbox with Landlock, seccomp and fd hygiene.

``from sandbox import Sandbox`` is the embedding API. Attributes are imported on first use
so that importing the package (stage 2's probe children do) costs almost nothing.
"""

from __future__ import annotations

__version__ = "0.1.0"

_EXPORTS = {
    "Sandbox": "api", "SandboxResult": "process", "SandboxProcess": "process",
    "Tier": "tiers", "Profile": "profile", "load_profile": "profile",
    "SandboxError": "errors", "UsageError": "errors", "ProfileError": "errors",
    "PreservedFdError": "errors", "TierError": "errors", "TierBelowFloorError": "errors",
    "HostError": "errors", "SetupError": "errors", "ExecutableDigestError": "errors",
    "WorkdirError": "errors", "BindError": "errors",
    "CommandNotFound": "errors", "CommandNotExecutable": "errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
