"""Helpers to test providers against the contract: random inputs, the accuracy metric, the kit.

Inputs for the ops: :func:`make_prefill_inputs` (M, N, H, D and a window pattern) and
:func:`make_paged_inputs` (a random paged cache) give random arguments with their float64 reference;
:func:`pack_paged_cache` packs your own keys into the paged layout the decode op reads.

The conformance suite itself is a pytest plugin (``mqa_core.testing.plugin``, entry point
``pytest11``): ``pytest --mqa-provider NAME`` runs it against an installed provider.

The names below load lazily: pytest imports this package for the plugin in every test run of every
environment where mqa-core is installed, and that must not cost a ``torch`` import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .data import (
        WINDOWS,
        Inputs,
        PagedCache,
        PagedInputs,
        calc_diff,
        make_inputs,
        make_paged_inputs,
        make_prefill_inputs,
        pack_paged_cache,
    )

__all__ = ["WINDOWS", "Inputs", "PagedCache", "PagedInputs", "calc_diff", "make_inputs", "make_paged_inputs",
           "make_prefill_inputs", "pack_paged_cache"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import data

        return getattr(data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
