"""What is installed, by distribution: the versions a benchmark row or a tuning stamp records.

Read from package metadata, so nothing is imported (asking for triton's version never imports it).
"""

from __future__ import annotations

import importlib.metadata as md

#: Distributions that provide the ``triton`` module (upstream, ROCm's build, nightlies).
TRITON_DISTS = ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-nightly")


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None when it is not installed."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def triton_version() -> str | None:
    """The version of whichever distribution provides ``triton`` here, or None."""
    return next(filter(None, (installed_version(d) for d in TRITON_DISTS)), None)
