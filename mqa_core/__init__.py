"""mqa-core: pick the best installed fp8 MQA-logits kernel for this device, and say why.

Providers are separate distributions that register a :class:`ProviderSpec` through the
``mqa_core.providers`` entry point group; see ``docs/writing-a-provider.md`` and ``docs/hooks.md``.
"""

from .api import (
    explain,
    fp8_mqa_logits,
    fp8_mqa_topk,
    fp8_paged_mqa_logits,
    fp8_paged_mqa_topk,
    get_provider,
    reload,
    topk_per_row,
)
from .arch import KNOWN_ARCHS, detect_arch, normalize_arch
from .decision import Candidate, Decision
from .discovery import BrokenPlugin, PluginInfo
from .errors import PluginError, ProviderResultError, ProviderUnavailableError, SettingsError
from .hookspecs import hookimpl
from .provider import Provider
from .schedule import paged_schedule
from .settings import env_positive_number
from .spec import CLAIMS, DTYPE_PAIRS, DTYPES, OPS, PairsByArch, Problem, ProviderSpec
from .tuning import TuningTable, load_tuning


def __getattr__(name: str) -> str:
    """``__version__`` on first use: reading the installed metadata costs about 1 ms, which an
    ``import mqa_core`` on a serving process's path should not pay."""
    if name != "__version__":
        raise AttributeError(f"module 'mqa_core' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("mqa-core")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value

__all__ = [
    "BrokenPlugin",
    "CLAIMS",
    "Candidate",
    "DTYPES",
    "DTYPE_PAIRS",
    "Decision",
    "KNOWN_ARCHS",
    "OPS",
    "PairsByArch",
    "PluginError",
    "PluginInfo",
    "Problem",
    "Provider",
    "ProviderResultError",
    "ProviderSpec",
    "ProviderUnavailableError",
    "SettingsError",
    "TuningTable",
    "detect_arch",
    "env_positive_number",
    "explain",
    "fp8_mqa_logits",
    "fp8_mqa_topk",
    "fp8_paged_mqa_logits",
    "fp8_paged_mqa_topk",
    "get_provider",
    "hookimpl",
    "load_tuning",
    "normalize_arch",
    "paged_schedule",
    "reload",
    "topk_per_row",
    "__version__",
]
