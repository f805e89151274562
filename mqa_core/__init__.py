"""mqa-core: pick the best installed fp8 MQA-logits kernel for this device, and say why.

Providers are separate distributions that register a :class:`ProviderSpec` through the
``mqa_core.providers`` entry point group; see ``docs/writing-a-provider.md``.
"""

from importlib.metadata import PackageNotFoundError, version

from .api import explain, fp8_mqa_logits, fp8_paged_mqa_logits, get_provider, reload
from .arch import KNOWN_ARCHS, detect_arch, normalize_arch
from .decision import Candidate, Decision
from .discovery import BrokenPlugin
from .errors import PluginError, ProviderUnavailableError
from .hookspecs import hookimpl
from .provider import Provider
from .spec import DTYPES, OPS, Problem, ProviderSpec

try:
    __version__ = version("mqa-core")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "BrokenPlugin",
    "Candidate",
    "DTYPES",
    "Decision",
    "KNOWN_ARCHS",
    "OPS",
    "PluginError",
    "Problem",
    "Provider",
    "ProviderSpec",
    "ProviderUnavailableError",
    "detect_arch",
    "explain",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_provider",
    "hookimpl",
    "normalize_arch",
    "reload",
    "__version__",
]
