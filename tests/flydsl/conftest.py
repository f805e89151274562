"""Fixtures for the FlyDSL provider's tests: stand-in ``aiter`` and ``flydsl`` distributions.

Every stand-in is a real distribution (modules + dist-info) installed by ``install_dist`` into a
temp site dir, so the provider meets it through importlib.metadata and the import system exactly
as it would meet the real package. The package skeletons follow ROCm/aiter's source: the released
layout (v0.1.18 to v0.1.20.post1) exports the entry only when ``flydsl`` is available; the later
layout with the gfx950 path imports ``flydsl`` unconditionally and resolves the entry lazily.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from mqa_provider_flydsl import aiter_probe, probe
from provider_probes import fresh_probe_fixture

KERNEL_SOURCE = (Path(__file__).parent / "standin_aiter_fp8_mqa_logits.py").read_text()
#: AITER's Triton/Gluon entries (the ``aiter`` provider's), one stand-in module for both files.
TRITON_SOURCE = (Path(__file__).parent / "standin_aiter_triton.py").read_text()
TRITON_FILES = ("aiter/ops/triton/attention/fp8_mqa_logits.py", "aiter/ops/triton/attention/pa_mqa_logits.py")
#: The released entry's module never names gfx950 in code; the stand-in's one mention is this line.
RELEASED_SOURCE = KERNEL_SOURCE.replace('CDNA4 = "gfx950"', "CDNA4 = None")
assert RELEASED_SOURCE != KERNEL_SOURCE and not re.search(r"""["']gfx950["']""", RELEASED_SOURCE)
#: Where each layout defines the entry (``probe.ENTRY_FILES``, relative to ``aiter/``).
RELEASED_ENTRY = "aiter/ops/flydsl/kernels/mqa_logits/fp8_mqa_logits.py"
LATER_ENTRY = "aiter/ops/flydsl/fp8_mqa_logits_kernels.py"

AMD_INIT = '''\
"""STAND-IN for AMD's AITER (distribution amd-aiter), installed by mqa-provider-flydsl's CPU tests."""
'''
_FLYDSL_VERSION_CHECK = '''\
_have = tuple(int(p) for p in _flydsl.__version__.split("+")[0].split(".")[:3])
if _have < (0, 2, 4):
    raise ImportError(f"Unsupported `flydsl` version: expected >=`0.2.4`, got `{_flydsl.__version__}`.")
'''
RELEASED_FLYDSL_INIT = '''\
"""STAND-IN for aiter/ops/flydsl/__init__.py of v0.1.18 to v0.1.20.post1: the kernels are imported,
and exported, only when is_flydsl_available()."""
from .utils import is_flydsl_available

__all__ = ["is_flydsl_available"]

if is_flydsl_available():
    import flydsl as _flydsl

''' + "\n".join("    " + line for line in _FLYDSL_VERSION_CHECK.splitlines()) + '''

    @ENTRY_IMPORT@
'''
RELEASED_UTILS = '''\
"""STAND-IN for aiter/ops/flydsl/utils.py's is_flydsl_available (v0.1.18 to v0.1.20.post1)."""
import importlib.util


def is_flydsl_available():
    if importlib.util.find_spec("flydsl") is None:
        return False
    from flydsl.runtime.device import get_rocm_arch
    from flydsl.utils.smem_allocator import SMEM_CAPACITY_MAP

    return get_rocm_arch() in SMEM_CAPACITY_MAP
'''
LATER_FLYDSL_INIT = '''\
"""STAND-IN for the later aiter/ops/flydsl/__init__.py: flydsl imported unconditionally, the
entry resolved lazily from fp8_mqa_logits_kernels."""
from importlib import import_module

import flydsl as _flydsl

''' + _FLYDSL_VERSION_CHECK + '''
_LAZY_IMPORTS = @LAZY@


def __getattr__(name):
    try:
        module_name, attr_name = _LAZY_IMPORTS[name]
    except KeyError as exc:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from exc
    return getattr(import_module(module_name, __name__), attr_name)
'''
FLYDSL_DEVICE = '''\
"""STAND-IN for flydsl.runtime.device: the GPU arch comes from MQA_TEST_AITER_GFX ("none": no GPU)."""
import os


def get_rocm_arch():
    arch = os.environ.get("MQA_TEST_AITER_GFX", "gfx942")
    if arch == "none":
        raise RuntimeError("stand-in flydsl: no ROCm device found")
    return arch
'''
FLYDSL_SMEM = '''\
"""STAND-IN for flydsl.utils.smem_allocator: the archs flydsl ships kernels for."""
SMEM_CAPACITY_MAP = {"gfx942": 65536, "gfx950": 163840}
'''
ASYNC_INIT = '''\
"""STAND-IN for the unrelated PyPI package 'aiter' (async-iterator helpers), in mqa-provider-flydsl's
CPU tests: same import name as AMD's AITER, nothing else in common."""

__version__ = "0.13.20191203"


async def iter_to_aiter(iterable):
    for item in iterable:
        yield item


async def map_aiter(fn, aiter):
    async for item in aiter:
        yield fn(item)
'''
NO_ROCM_INIT = '''\
"""STAND-IN for AMD's AITER on a machine without ROCm: importing it raises, as the real one does."""
raise RuntimeError("stand-in AITER: no ROCm/HIP runtime found (hipGetDeviceCount failed)")
'''


#: No cached AITER answer leaks between tests; the stand-in's arch defaults to gfx942.
_fresh_probe = fresh_probe_fixture(probe, "MQA_TEST_AITER_GFX")
_fresh_aiter_probe = fresh_probe_fixture(aiter_probe, "MQA_TEST_AITER_GFX")


@pytest.fixture
def flydsl_pkg(install_dist) -> Callable[..., None]:
    """``flydsl_pkg(version="0.2.4")`` installs the stand-in flydsl compiler package."""

    def install(version: str = "0.2.4") -> None:
        install_dist("flydsl", version, {
            "flydsl/__init__.py": f'"""STAND-IN for the flydsl compiler package."""\n__version__ = "{version}"\n',
            "flydsl/runtime/__init__.py": "", "flydsl/runtime/device.py": FLYDSL_DEVICE,
            "flydsl/utils/__init__.py": "", "flydsl/utils/smem_allocator.py": FLYDSL_SMEM,
        })

    return install


@pytest.fixture
def amd_aiter(install_dist, flydsl_pkg) -> Callable[..., None]:
    """``amd_aiter(version=None, *, gfx950=True, entry=True, flydsl="0.2.4", triton=False)`` installs a
    stand-in AITER (``triton=True``: with the Triton/Gluon entries the ``aiter`` provider calls).

    ``gfx950=True``: the later layout with the gfx950 path; False: a release, v0.1.18 to v0.1.20.post1
    (gfx942-only, entry exported only when flydsl is available). ``entry=False``: an AITER older than
    the entry (ROCm/aiter#3913). ``flydsl=None``: the flydsl package is not installed.
    """

    def install(version: str | None = None, *, gfx950: bool = True, entry: bool = True,
                flydsl: str | None = "0.2.4", triton: bool = False) -> None:
        if flydsl is not None:
            flydsl_pkg(flydsl)
        files = {"aiter/__init__.py": AMD_INIT, "aiter/ops/__init__.py": ""}
        if triton:  # AITER's Triton/Gluon entries (the aiter provider's)
            files.update({"aiter/ops/triton/__init__.py": "", "aiter/ops/triton/attention/__init__.py": ""})
            files.update({f: TRITON_SOURCE for f in TRITON_FILES})
        if gfx950:
            lazy = ({"flydsl_fp8_mqa_logits": (".fp8_mqa_logits_kernels", "flydsl_fp8_mqa_logits")}
                    if entry else {})
            files["aiter/ops/flydsl/__init__.py"] = LATER_FLYDSL_INIT.replace("@LAZY@", repr(lazy))
            if entry:
                files[LATER_ENTRY] = KERNEL_SOURCE
        else:
            entry_import = ("from .kernels.mqa_logits.fp8_mqa_logits import flydsl_fp8_mqa_logits  # noqa"
                            if entry else "pass")
            files["aiter/ops/flydsl/__init__.py"] = RELEASED_FLYDSL_INIT.replace("@ENTRY_IMPORT@", entry_import)
            files["aiter/ops/flydsl/utils.py"] = RELEASED_UTILS
            files["aiter/ops/flydsl/kernels/__init__.py"] = ""
            files["aiter/ops/flydsl/kernels/mqa_logits/__init__.py"] = ""
            if entry:
                files[RELEASED_ENTRY] = RELEASED_SOURCE
        default = "0.1.24.dev7+g01668150e" if gfx950 else "0.1.20.post1"
        install_dist("amd-aiter", version or default, files)

    return install


@pytest.fixture
def async_aiter(install_dist) -> None:
    """The unrelated async-iterator ``aiter`` from PyPI, as a stand-in."""
    install_dist("aiter", "0.13.20191203", {"aiter/__init__.py": ASYNC_INIT})


@pytest.fixture
def aiter_without_rocm(install_dist, flydsl_pkg) -> None:
    """AMD's AITER whose import raises RuntimeError, as it does without ROCm."""
    flydsl_pkg()
    install_dist("amd-aiter", "0.1.20.post1", {"aiter/__init__.py": NO_ROCM_INIT, "aiter/ops/__init__.py": ""})
