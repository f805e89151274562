"""Helpers to test providers against the contract: random inputs, the accuracy metric, the kit.

The conformance suite itself is a pytest plugin (``mqa_core.testing.plugin``, entry point
``pytest11``): ``pytest --mqa-provider NAME`` runs it against an installed provider.
"""

from .data import WINDOWS, Inputs, PagedInputs, calc_diff, make_inputs, make_paged_inputs

__all__ = ["WINDOWS", "Inputs", "PagedInputs", "calc_diff", "make_inputs", "make_paged_inputs"]
