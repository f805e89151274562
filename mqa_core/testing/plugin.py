"""pytest plugin (entry point ``pytest11``, name ``mqa_core.testing.plugin``): the conformance kit's
options, markers and suite.

With ``--mqa-provider NAME`` the suite (``conformance.py`` next to this file) joins the collection:
alone when no test paths were given (``pytest --mqa-provider NAME`` certifies NAME and nothing
else), next to them when paths were given. Without the option the plugin adds nothing, so a
project's own test run does not grow. Nothing heavy is imported unless the option is used.
``-p no:mqa_core.testing.plugin`` turns it off.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from .bound import Accumulation

# Before anything imports them: failures in the helpers show the compared values.
pytest.register_assert_rewrite("mqa_core.testing.checks")

SUITE = Path(__file__).with_name("conformance.py")
#: The run's base seed: random unless ``--mqa-seed``; each case derives its own from it.
BASE_SEED = pytest.StashKey[int]()
#: The one (q, k) dtype pair ``--mqa-dtype`` asks for, if any.
DTYPE_PAIR = pytest.StashKey["tuple[str, str] | None"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mqa", "mqa-core conformance kit")
    group.addoption("--mqa-provider", action="append", default=[], metavar="NAME",
                    help="run the conformance suite against this installed provider (repeatable)")
    group.addoption("--mqa-device", default=None, metavar="DEV",
                    help="torch device for the suite (default: cuda if available, else cpu)")
    group.addoption("--mqa-seed", type=int, default=None, metavar="N",
                    help="base seed for the suite's random inputs (default: fresh each run)")
    group.addoption("--mqa-dtype", default=None, metavar="Q[,K]",
                    help="run only this dtype pair, e.g. float8_e4m3fn or e4m3fn,e4m3fnuz "
                         "(default: every pair each provider declares on the device's arch)")
    group.addoption("--mqa-accumulation", default=None, choices=("fp32", "fp8-mma"),
                    help="error model for the per-cell bound (default: fp32 on the CPU, fp8-mma on GPUs, "
                         "whose fp8 matrix units keep fewer bits; see docs/conformance.md)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU")
    config.addinivalue_line("markers", "rocm: needs an AMD gfx942/gfx950 GPU with ROCm and AMD's AITER")
    config.addinivalue_line("markers", "mqa_large: conformance cases with offsets past 2**31 (GPUs with "
                                       "enough free memory; a scaled version on the CPU)")
    if not config.getoption("mqa_provider"):
        return
    seed = config.getoption("mqa_seed")
    config.stash[BASE_SEED] = secrets.randbelow(2**31) if seed is None else seed
    dtype = config.getoption("mqa_dtype")
    if dtype:
        from .cases import parse_pair

        try:
            config.stash[DTYPE_PAIR] = parse_pair(dtype)
        except ValueError as exc:
            raise pytest.UsageError(f"--mqa-dtype: {exc}") from None
    suite = str(SUITE)
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        if not any(Path(a).resolve() == SUITE.resolve() for a in config.args if "::" not in a):
            config.args.append(suite)
    else:  # no paths given: testpaths or the current directory would be collected; run the kit alone
        config.args[:] = [suite]


def pytest_report_header(config: pytest.Config) -> str | None:
    names = config.getoption("mqa_provider")
    if not names:
        return None
    pair = config.stash.get(DTYPE_PAIR, None)
    dtypes = f"dtype {pair[0]} x {pair[1]}" if pair else "every declared dtype pair"
    return (f"mqa conformance kit: providers {', '.join(names)} on {kit_device(config)} "
            f"({kit_arch(config)}), {dtypes}, {kit_accumulation(config).name} error bound, "
            f"base seed {config.stash[BASE_SEED]} (reproduce with --mqa-seed {config.stash[BASE_SEED]})")


def kit_device(config: pytest.Config) -> "torch.device":
    import torch

    name = config.getoption("mqa_device")
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def kit_arch(config: pytest.Config) -> str:
    from ..arch import arch_of_device

    return arch_of_device(kit_device(config))


def kit_accumulation(config: pytest.Config) -> "Accumulation":
    from .bound import ACCUMULATIONS, default_accumulation

    name = config.getoption("mqa_accumulation")
    return ACCUMULATIONS[name] if name else default_accumulation(kit_device(config))
