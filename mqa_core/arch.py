"""Arch names: one spelling per chip family, detected from a device or normalised from user text.

Specs and selection only ever see normalised names (``sm_90``, ``gfx950``, ``cpu``), so a provider
that declares ``sm_90`` matches a user who typed ``SM90`` or a ROCm device reporting
``gfx942:sramecc+:xnack-``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

#: Archs the shipped providers are written and tested for: documentation only. Any well-formed
#: name is accepted (``sm_XY[Z]``, ``gfxNNN[N]``, ``cpu``) and providers decide whether they serve it.
KNOWN_ARCHS = (
    "cpu",
    "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121",
    "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201",
)
#: A spec that declares this serves every arch (the reference provider).
ANY_ARCH = "any"

# re.ASCII: \d is 0-9 only (without it, "sm_٩٠" would be an arch, spelled in Arabic-Indic digits)
_SM = re.compile(r"(?:sm|compute)_?(\d{2,3})[af]?", re.ASCII)
_CC = re.compile(r"(\d{1,2})\.(\d)", re.ASCII)
_GFX = re.compile(r"(gfx\d{2,3}[0-9a-f])(?::[a-z0-9+\-:]*)?", re.ASCII)
_ACCEPTED = ("sm_XY[Z] (sm_90, sm90, SM_90, sm_90a, compute_90, 9.0, sm_100, sm_121), "
             "gfxNNN[N] (gfx942, gfx950:sramecc+:xnack-, gfx90a, gfx1151) and cpu")


def normalize_arch(name: str) -> str:
    """The canonical spelling of a well-formed arch name; ValueError with the accepted forms otherwise.

    Whether an arch is served is for the providers to say: ``sm_91`` or ``gfx1151`` are accepted here.
    """
    if not isinstance(name, str):
        raise TypeError(f"arch must be a str, got {type(name).__name__}")
    return _normalize(name)


@functools.lru_cache(maxsize=256)
def _normalize(name: str) -> str:
    text = name.strip().lower()
    if not text.isascii():
        raise ValueError(f"malformed arch {name!r}: arch names are ASCII; accepted forms are {_ACCEPTED}")
    if text == "cpu":
        return "cpu"
    m = _SM.fullmatch(text)
    if m:
        return f"sm_{m.group(1)}"
    m = _CC.fullmatch(text)
    if m:
        return f"sm_{m.group(1)}{m.group(2)}"
    m = _GFX.fullmatch(text)
    if m:
        return m.group(1)
    raise ValueError(f"malformed arch {name!r}: accepted forms are {_ACCEPTED}")


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
