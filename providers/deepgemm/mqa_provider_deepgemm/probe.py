"""Is an installed ``deep_gemm`` usable for an arch, and which API generation is it? Cheap, cached, never raises.

``import deep_gemm`` loads its CUDA extension and initialises its JIT runtime (``deep_gemm/__init__.py``
calls ``_C.init`` with the CUDA home), which fails without a CUDA build of torch and costs time. So the
questions come in this order: the arch, then the package on disk and its metadata (no import), and
only for an arch DeepGEMM serves, one import per discovery, its result cached.

The API generation is read from what the module exports (names, never version strings: vLLM and
SGLang install their own builds and forks under the same import name):

- ``fp8_fp4``: ``fp8_fp4_mqa_logits((q, sf), kv, weights, ks, ke, clean_logits, max_seqlen_k,
  logits_dtype)`` and ``fp8_fp4_paged_mqa_logits((q, sf), kv_cache, weights, context_lens,
  block_table, schedule_meta, max_context_len, clean_logits, logits_dtype, indices)`` (DeepGEMM
  2.2+, e.g. 54e2261 ``csrc/apis/attention.hpp:440-455``); 2-D context lengths only, no paged clean.
- ``legacy``: ``fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits)`` and ``fp8_paged_mqa_logits(q,
  kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits)`` only
  (DeepGEMM 2.1 as vLLM and SGLang shipped it); 1-D or 2-D context lengths.

Both export ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)`` and ``get_num_sms()``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The archs DeepGEMM's MQA-logits kernels are written for (``attention.hpp`` dispatches on
#: ``arch_major == 9`` and ``== 10``; its JIT names sm_100 "100a", so sm_103 is not claimed).
ARCHS = ("sm_90", "sm_100")
MODULE = "deep_gemm"
#: Distribution names DeepGEMM's setup.py (``name='deep_gemm'``) and forks publish under.
DISTS = ("deep_gemm", "deep-gemm")
_INSTALL = ("build DeepGEMM from source (github.com/deepseek-ai/DeepGEMM, ./install.sh) or install the "
            "build your engine ships (vLLM, SGLang)")

#: Exports that identify each generation, newest first.
FP8_FP4_NAMES = ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata",
                 "get_num_sms")
LEGACY_NAMES = ("fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata", "get_num_sms")


@dataclass(frozen=True)
class Installed:
    """What the environment holds under the import name ``deep_gemm``, learned without importing it."""

    #: Why it cannot be used, or None when it may be.
    problem: str | None
    #: Version from distribution metadata, if any (a source checkout on PYTHONPATH has none).
    version: str | None = None
    #: Where ``deep_gemm`` would be imported from, for messages.
    location: str = ""


@dataclass(frozen=True)
class Api:
    """One DeepGEMM generation's attention entries behind the same four calls.

    ``mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits)``,
    ``paged_mqa_logits(q, kv_cache, weights, lens_2d, block_table, schedule_meta, max_context_len)``
    (never asked to clean: no generation cleans with 2-D lengths),
    ``paged_metadata(lens_2d, block_kv, num_sms)`` and ``num_sms()``.
    """

    generation: str
    version: str
    mqa_logits: Callable[..., Any]
    paged_mqa_logits: Callable[..., Any]
    paged_metadata: Callable[..., Any]
    num_sms: Callable[[], int]
    #: The fp8_fp4 generation's own entries (None for the legacy one), for FP4 calls: they take q as
    #: ``(values, scales)`` and kv as ``(values, scales)`` as DeepGEMM does.
    fp8_fp4_mqa_logits: Callable[..., Any] | None = None
    fp8_fp4_paged_mqa_logits: Callable[..., Any] | None = None


def _err(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _dist_version() -> str | None:
    for name in DISTS:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def installed() -> Installed:
    """Whether ``deep_gemm`` is importable and from where; imports nothing."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except Exception as exc:
        return Installed(f"DeepGEMM not importable: {_err(exc)}")
    if spec is None:
        return Installed(f"DeepGEMM not importable: no module named '{MODULE}'; {_INSTALL}")
    location = next(iter(spec.submodule_search_locations or ()), None) or spec.origin or "?"
    return Installed(None, _dist_version(), location)


def detect(module: Any, version: str = "") -> tuple[Api | None, str | None]:
    """The generation ``module`` exports, as an :class:`Api`, or (None, why it is not one we know)."""
    name = f"DeepGEMM {version}".rstrip()

    def has(names: tuple[str, ...]) -> list[str]:
        return [n for n in names if not callable(getattr(module, n, None))]

    missing_new, missing_old = has(FP8_FP4_NAMES), has(LEGACY_NAMES)
    if not missing_new:
        fp8_fp4, paged = module.fp8_fp4_mqa_logits, module.fp8_fp4_paged_mqa_logits

        def mqa_logits(q: Any, k: Any, k_scale: Any, weights: Any, ks: Any, ke: Any, clean: bool) -> Any:
            return fp8_fp4((q, None), (k, k_scale), weights, ks, ke, clean)

        def paged_mqa_logits(q: Any, cache: Any, weights: Any, lens: Any, table: Any, meta: Any,
                             max_len: int) -> Any:
            return paged((q, None), cache, weights, lens, table, meta, max_len, False)

        return Api("fp8_fp4", version, mqa_logits, paged_mqa_logits, module.get_paged_mqa_logits_metadata,
                   module.get_num_sms, fp8_fp4, paged), None
    if not missing_old:
        legacy, legacy_paged = module.fp8_mqa_logits, module.fp8_paged_mqa_logits

        def legacy_mqa_logits(q: Any, k: Any, k_scale: Any, weights: Any, ks: Any, ke: Any,
                              clean: bool) -> Any:
            return legacy(q, (k, k_scale), weights, ks, ke, clean)

        def legacy_paged_mqa_logits(q: Any, cache: Any, weights: Any, lens: Any, table: Any, meta: Any,
                                    max_len: int) -> Any:
            return legacy_paged(q, cache, weights, lens, table, meta, max_len, False)

        return Api("legacy", version, legacy_mqa_logits, legacy_paged_mqa_logits,
                   module.get_paged_mqa_logits_metadata, module.get_num_sms), None
    return None, (f"{name} exports neither known MQA-logits API: the fp8_fp4 generation lacks "
                  f"{', '.join(missing_new)}; the legacy one lacks {', '.join(missing_old)} "
                  "(a build without the attention kernels, e.g. CUDA < 12.3, or an unknown generation)")


@functools.lru_cache(maxsize=1)
def load_api() -> tuple[Api | None, str | None]:
    """Import DeepGEMM once: ``(Api, None)`` or ``(None, why not)``."""
    found = installed()
    if found.problem:
        return None, found.problem
    try:
        module = importlib.import_module(MODULE)
    except (Exception, SystemExit) as exc:  # without CUDA: ImportError (libcuda), AssertionError (CUDA home)
        return None, f"DeepGEMM at {found.location} does not import: {_err(exc)}"
    version = found.version or str(getattr(module, "__version__", "") or "")
    return detect(module, version)


@functools.cache
def _check(arch: str) -> str | None:
    if arch not in ARCHS:
        return f"DeepGEMM's MQA-logits kernels are written for {', '.join(ARCHS)}, not {arch}"
    found = installed()
    if found.problem:
        return found.problem
    return load_api()[1]


def check(arch: str) -> str | None:
    """The spec's runtime check: None when DeepGEMM can serve ``arch`` here, else exactly why not.

    Answers for what is installed, never for the local device (``mqa explain --arch sm_90`` on any
    machine tells whether this environment would serve sm_90); the adapter checks the tensors' device.
    """
    try:
        return _check(arch)
    except Exception as exc:  # a check must never take the process down
        return f"deepgemm runtime check failed: {_err(exc)}"


def reset() -> None:
    """Forget cached answers (called at each discovery, so ``mqa_core.reload()`` re-probes)."""
    importlib.invalidate_caches()
    installed.cache_clear()
    load_api.cache_clear()
    _check.cache_clear()
