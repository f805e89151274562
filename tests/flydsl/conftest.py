"""Fixtures for the FlyDSL provider's tests: stand-in ``aiter`` distributions.

Every stand-in is a real distribution (modules + dist-info) installed by ``install_dist`` into a
temp site dir, so the provider meets it through importlib.metadata and the import system exactly
as it would meet the real package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mqa_provider_flydsl import probe

KERNEL_SOURCE = (Path(__file__).parent / "standin_aiter_fp8_mqa_logits.py").read_text()

# The package skeleton of AMD's AITER (aiter/ops/flydsl/...), as the stand-ins reproduce it.
AMD_INIT = '''\
"""STAND-IN for AMD's AITER (distribution amd-aiter), installed by mqa-provider-flydsl's CPU tests."""
'''
FLYDSL_INIT = '''\
"""STAND-IN for aiter.ops.flydsl: the real one resolves its kernels lazily, like this."""
from importlib import import_module


def __getattr__(name):
    if name == "flydsl_fp8_mqa_logits":
        return import_module(".fp8_mqa_logits_kernels", __name__).flydsl_fp8_mqa_logits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
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


@pytest.fixture(autouse=True)
def _fresh_probe(monkeypatch: pytest.MonkeyPatch):
    """No cached AITER answer leaks between tests; the stand-in's arch defaults to gfx942."""
    monkeypatch.delenv("MQA_TEST_AITER_GFX", raising=False)
    probe.reset()
    yield
    probe.reset()


@pytest.fixture
def amd_aiter(install_dist) -> Callable[..., None]:
    """``amd_aiter(version="0.1.23", entry=True)`` installs the stand-in AMD AITER."""

    def install(version: str = "0.1.23", *, entry: bool = True) -> None:
        files = {
            "aiter/__init__.py": AMD_INIT,
            "aiter/ops/__init__.py": "",
            "aiter/ops/flydsl/__init__.py": FLYDSL_INIT if entry else '"""STAND-IN: no MQA kernel."""\n',
        }
        if entry:
            files["aiter/ops/flydsl/fp8_mqa_logits_kernels.py"] = KERNEL_SOURCE
        install_dist("amd-aiter", version, files)

    return install


@pytest.fixture
def async_aiter(install_dist) -> None:
    """The unrelated async-iterator ``aiter`` from PyPI, as a stand-in."""
    install_dist("aiter", "0.13.20191203", {"aiter/__init__.py": ASYNC_INIT})


@pytest.fixture
def aiter_without_rocm(install_dist) -> None:
    """AMD's AITER whose import raises RuntimeError, as it does without ROCm."""
    install_dist("amd-aiter", "0.1.23", {"aiter/__init__.py": NO_ROCM_INIT, "aiter/ops/__init__.py": ""})
