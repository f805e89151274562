"""pytest plugin (entry point ``pytest11``): options and markers of the mqa conformance kit."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mqa", "mqa-core conformance kit")
    group.addoption("--mqa-provider", action="append", default=[], metavar="NAME",
                    help="run the conformance suite against this installed provider (repeatable)")
    group.addoption("--mqa-device", default=None, metavar="DEV",
                    help="torch device for the suite (default: cuda if available, else cpu)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU")
    config.addinivalue_line("markers", "rocm: needs an AMD gfx942/gfx950 GPU with ROCm and AMD's AITER")
