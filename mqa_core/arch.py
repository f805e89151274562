"""Arch names: one spelling per chip family, detected from a device or normalised from user text.

Specs and selection only ever see normalised names (``sm_90``, ``gfx950``, ``cpu``), so a provider
that declares ``sm_90`` matches a user who typed ``SM90`` or a ROCm device reporting
``gfx942:sramecc+:xnack-``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

#: Every arch name a spec may declare. NVIDIA by compute capability, AMD by gfx target.
KNOWN_ARCHS = (
    "cpu",
    "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121",
    "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201",
)
#: A spec that declares this serves every arch (the reference provider).
ANY_ARCH = "any"

_SM = re.compile(r"^(?:sm|compute)_?(\d{2,3})a?$")
_CC = re.compile(r"^(\d{1,2})\.(\d)$")
_GFX = re.compile(r"^(gfx[0-9a-f]{3,4})(?::.*)?$")
_ACCEPTED = "sm_90 / sm90 / SM_90 / sm_90a / 9.0, gfx942 / gfx950:sramecc+:xnack-, cpu"


def normalize_arch(name: str) -> str:
    """Return the canonical spelling of ``name`` or raise ValueError listing the accepted forms."""
    if not isinstance(name, str):
        raise TypeError(f"arch must be a str, got {type(name).__name__}")
    text = name.strip().lower()
    if text == "cpu":
        return "cpu"
    m = _SM.match(text)
    if m:
        arch = f"sm_{m.group(1)}"
    elif _CC.match(text):
        major, minor = _CC.match(text).groups()  # type: ignore[union-attr]
        arch = f"sm_{major}{minor}"
    elif _GFX.match(text):
        arch = _GFX.match(text).group(1)  # type: ignore[union-attr]
    else:
        arch = ""
    if arch not in KNOWN_ARCHS:
        raise ValueError(f"unknown arch {name!r}: accepted forms are {_ACCEPTED}; "
                         f"known archs: {', '.join(KNOWN_ARCHS)}")
    return arch


def arch_of_device(device: Any) -> str:
    """The normalised arch of a torch device (``"cuda:1"``, ``torch.device``, index or None)."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(f"no arch for device type {dev.type!r}: mqa_core serves cpu and cuda/rocm devices")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return _cuda_arch(index)


@functools.cache
def _cuda_arch(index: int) -> str:
    # Device properties do not change while a process lives, so one query per device index.
    import torch

    props = torch.cuda.get_device_properties(index)
    gcn = getattr(props, "gcnArchName", "") if getattr(torch.version, "hip", None) else ""
    return normalize_arch(gcn) if gcn else normalize_arch(f"sm_{props.major}{props.minor}")


def detect_arch(device: Any = None) -> str:
    """The arch of ``device``; with None, the current CUDA/ROCm device if there is one, else ``cpu``."""
    if device is None:
        import torch

        if not torch.cuda.is_available():
            return "cpu"
    return arch_of_device(device)
