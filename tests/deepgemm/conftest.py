"""Fixtures for the DeepGEMM provider's tests: stand-in ``deep_gemm`` distributions of each API generation.

Every stand-in is a real distribution (modules + dist-info) installed by ``install_dist`` into a temp
site dir, so the provider meets it through importlib.metadata and the import system exactly as it
would meet a DeepGEMM build.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from mqa_provider_deepgemm import probe
from provider_probes import fresh_probe_fixture

STANDIN = (Path(__file__).parent / "standin_deep_gemm.py").read_text()

INIT = {
    # DeepGEMM 2.2+ (54e2261): the fp8_fp4 forms plus the legacy wrappers.
    "fp8_fp4": '''\
"""STAND-IN for DeepGEMM (fp8_fp4 generation), installed by mqa-provider-deepgemm's CPU tests."""
from ._standin import (CALLS, fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits, fp8_mqa_logits,
                       fp8_paged_mqa_logits, get_num_sms, get_paged_mqa_logits_metadata)

__version__ = "2.6.1"
''',
    # DeepGEMM 2.1 as vLLM and SGLang shipped it: legacy names only, 1-D or 2-D lengths.
    "legacy": '''\
"""STAND-IN for DeepGEMM (legacy generation), installed by mqa-provider-deepgemm's CPU tests."""
from . import _standin

_standin.GENERATION = "legacy"
from ._standin import CALLS, fp8_mqa_logits, fp8_paged_mqa_logits, get_num_sms, get_paged_mqa_logits_metadata

__version__ = "2.1.0"
''',
    # A build with GEMMs but no attention kernels (deep_gemm/__init__.py swallows that ImportError).
    "gemm_only": '''\
"""STAND-IN for a DeepGEMM built without its attention kernels."""


def fp8_gemm_nt(*args, **kwargs):
    raise NotImplementedError


def get_num_sms():
    return 132
''',
    # What `import deep_gemm` does on a machine without CUDA (deep_gemm/__init__.py asserts a CUDA home).
    "no_cuda": '''\
"""STAND-IN for DeepGEMM on a machine without CUDA: importing it raises, as the real one does."""
raise AssertionError("stand-in DeepGEMM: CUDA home not found (_find_cuda_home)")
''',
}


#: No cached DeepGEMM answer leaks between tests; the stand-in's arch defaults to sm_90.
_fresh_probe = fresh_probe_fixture(probe, "MQA_TEST_DEEPGEMM_ARCH")


@pytest.fixture
def deep_gemm(install_dist) -> Callable[..., None]:
    """``deep_gemm("fp8_fp4" | "legacy" | "gemm_only" | "no_cuda", version=..., metadata=True)``."""

    def install(generation: str = "fp8_fp4", *, version: str = "2.6.1+54e2261", metadata: bool = True) -> None:
        files = {"deep_gemm/__init__.py": INIT[generation]}
        if generation in ("fp8_fp4", "legacy"):
            files["deep_gemm/_standin.py"] = STANDIN
        install_dist("deep_gemm" if metadata else "some-bundle", version, files)

    return install
