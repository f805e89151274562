"""Fixtures the Triton and Gluon launcher tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def fresh_plans() -> Iterator[None]:
    """Each test decides its launch plans anew (some fake what the device reports), and leaves none
    behind: the Triton and Gluon prefill launchers' plans, bound kernels and device facts."""
    from mqa_provider_gluon.ops import mqa_logits_gluon_sm90, mqa_logits_triton

    mqa_logits_triton.clear_caches()
    mqa_logits_gluon_sm90.clear_caches()
    yield
    mqa_logits_triton.clear_caches()
    mqa_logits_gluon_sm90.clear_caches()
