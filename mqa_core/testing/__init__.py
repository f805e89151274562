"""Helpers to test providers against the contract: random inputs, the accuracy metric, the kit.

The conformance suite itself is a pytest plugin (``mqa_core.testing.plugin``, entry point
``pytest11``): ``pytest --mqa-provider NAME`` runs it against an installed provider.

The names below load lazily: pytest imports this package for the plugin in every test run of every
environment where mqa-core is installed, and that must not cost a ``torch`` import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .data import WINDOWS, Inputs, PagedInputs, calc_diff, make_inputs, make_paged_inputs

__all__ = ["WINDOWS", "Inputs", "PagedInputs", "calc_diff", "make_inputs", "make_paged_inputs"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import data

        return getattr(data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
