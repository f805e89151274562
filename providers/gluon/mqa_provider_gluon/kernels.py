"""The kernel objects behind the ``gluon`` and ``triton`` specs: pick a kernel per device, then launch.

Loading this module is cheap (no triton import); the kernel modules load on the first call. Which
launcher serves a device is decided once per device; the launchers themselves decide the rest once per
call signature (see ``mqa_provider_gluon.launch``). (q, k) dtype pairs each arch serves: ``DTYPE_PAIRS``;
on gfx942 the Triton launcher relabels e4m3fn operands to e4m3fnuz exactly.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: A prefill launcher: (q, k, k_scale, weights, ks, ke, clean_logits) -> logits.
Launcher = Callable[..., torch.Tensor]


@functools.cache
def prefill_launcher(use_gluon: bool, device_index: int) -> Launcher:
    """The launcher for a device (-1: the CPU): the Gluon sm_90 kernel where it runs and is wanted,
    else the portable Triton kernel. Cached: a device does not change what it is."""
    if use_gluon and device_index >= 0:
        from .ops.mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon, gluon_supported

        if gluon_supported(device_index) is None:
            return fp8_mqa_logits_gluon
    from .ops.mqa_logits_triton import fp8_mqa_logits_triton

    return fp8_mqa_logits_triton


@functools.cache
def paged_launcher(use_gluon: bool, device_index: int) -> tuple[Launcher, Callable[..., Launcher | None], bool]:
    """The decode launcher, its ``prepare`` and whether both take a ``schedule``, for a device,
    imported on the first call: on sm_90
    for the ``gluon`` provider, the dispatcher that sends each call signature to the warp-specialised
    Gluon kernel where it was measured ahead, else to the Triton kernel; the Triton kernel elsewhere.
    Cached: an import statement would cost every call ~0.7 us."""
    if use_gluon and device_index >= 0:
        from .ops.mqa_logits_gluon_sm90 import gluon_supported

        if gluon_supported(device_index) is None:
            from .ops.paged_mqa_logits_gluon_sm90 import fp8_paged_mqa_logits_sm90, prepare_sm90

            return fp8_paged_mqa_logits_sm90, prepare_sm90, True
    from .ops.paged_mqa_logits_triton import fp8_paged_mqa_logits_triton, prepare

    return fp8_paged_mqa_logits_triton, prepare, False


def _with_schedule(fn: Callable[..., Any], reads: bool, schedule: torch.Tensor | None, *args: Any,
                   logits_dtype: torch.dtype | None = None) -> Any:
    """``fn(*args)``, with ``schedule=`` where ``fn`` reads one (``reads``) and the call has one, and
    ``logits_dtype=`` where the call asks for other logits than float32."""
    kw: dict[str, Any] = {} if logits_dtype is None else {"logits_dtype": logits_dtype}
    if schedule is not None and reads:
        kw["schedule"] = schedule
    return fn(*args, **kw) if kw else fn(*args)


#: The ``gluon`` provider's prefill top-k on sm_90: "fused" (the Gluon kernels score the fused
#: indexer, no [M, N] matrix), "sliced" (the fused indexer's orchestration over Gluon logits in key
#: slices, each filtered by a streaming kernel: ``filter="slices"``), "two-stage" (Gluon logits in
#: row chunks, then the Triton select over every logit) or "auto" (:func:`prefill_topk_path`).
GLUON_PREFILL_TOPK = "auto"

#: "auto" takes the sliced path where a two-stage row chunk would hold fewer rows than this. Such
#: thin chunks keep the logits kernel and the select far from full (H100, 2026-12-08: at 1M keys, 31
#: rows a chunk, sliced 20.8 ms against 27.2; at 128k, 252 rows, 11.9 against 12.0 at topk 2048 and
#: 10.8 against 11.7 at topk 512; wider chunks were not measured).
SLICED_BELOW_ROWS = 256


def prefill_topk_path(n: int, topk: int, workspace_bytes: int) -> str:
    """"sliced" or "two-stage" for a prefill call over ``n`` keys when :data:`GLUON_PREFILL_TOPK` is
    "auto": by the rows the two-stage path's chunk holds at full-width windows (its logits take half
    the workspace), so the choice depends on the keys and the workspace, never on the batch."""
    from mqa_core.composed import split_workspace

    cells, _ = split_workspace(workspace_bytes, topk, False)
    return "sliced" if cells // (n + topk) < SLICED_BELOW_ROWS else "two-stage"


@dataclass(frozen=True)
class MqaKernels:
    #: Try the Gluon sm_90 kernel first (the ``gluon`` provider); False: always Triton (``triton``).
    use_gluon: bool

    def fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                       clean_logits: bool = True, logits_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``logits_dtype`` (mqa-core's hint, given for bf16 logits only): the kernels write bf16 themselves."""
        k, k_scale = kv  # k_scale [N] or [N, 1]: both launchers take either as it is
        launch = prefill_launcher(self.use_gluon, q.get_device())
        if logits_dtype is None:
            return launch(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
        return launch(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits, logits_dtype=logits_dtype)

    def prepare_fp8_mqa_logits(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                               cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, *,
                               clean_logits: bool = True, logits_dtype: torch.dtype | None = None) -> Launcher | None:
        """mqa-core's optional per-signature call (docs/writing-a-provider.md): the device's launcher's
        bound launch with everything the signature fixes worked out once (its module's ``prepare``),
        or None where calls take the full path."""
        launcher = prefill_launcher(self.use_gluon, q.get_device())
        k, k_scale = kv
        prepare = sys.modules[launcher.__module__].prepare
        if logits_dtype is None:
            return prepare(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
        return prepare(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits, logits_dtype=logits_dtype)

    def fp8_paged_mqa_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int, *,
                             clean_logits: bool = True, schedule: torch.Tensor | None = None,
                             logits_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``schedule`` (``mqa_core.paged_schedule``) is read by the Gluon sm_90 kernel, not by the
        Triton one; the logits are the same either way. ``logits_dtype``: as for prefill."""
        launch, _, reads = paged_launcher(self.use_gluon, q.get_device())
        return _with_schedule(launch, reads, schedule, q, kv_cache, weights, context_lens, block_tables,
                              max_context_len, clean_logits, logits_dtype=logits_dtype)

    def prepare_fp8_paged_mqa_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                                     context_lens: torch.Tensor, block_tables: torch.Tensor,
                                     max_context_len: int, *, clean_logits: bool = True,
                                     schedule: torch.Tensor | None = None,
                                     logits_dtype: torch.dtype | None = None) -> Launcher | None:
        """mqa-core's optional per-signature call (docs/writing-a-provider.md): the device's decode
        launch with everything the signature fixes worked out once, or None where calls take the full
        path. It takes ``schedule`` as the call does."""
        _, prepare, reads = paged_launcher(self.use_gluon, q.get_device())
        return _with_schedule(prepare, reads, schedule, q, kv_cache, weights, context_lens, block_tables,
                              max_context_len, clean_logits, logits_dtype=logits_dtype)


    # -- the indexer step ------------------------------------------------------------------------

    def topk_per_row(self, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                     positions: str = "relative", return_values: bool = False,
                     workspace_bytes: int = 256 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The Triton radix select (``ops.topk_triton``), rows chunked only where its candidate
        workspace would not fit what ``workspace_bytes`` leaves beside the outputs allocated here."""
        from .ops.topk_triton import topk_per_row_triton
        from .ops.topk_triton import workspace_bytes as topk_workspace

        m, n = logits.shape
        out = torch.empty((m, topk), dtype=torch.int32, device=logits.device)
        values = torch.empty((m, topk), dtype=torch.float32, device=logits.device) if return_values else None
        room = workspace_bytes - m * topk * (8 if return_values else 4)
        rows = m
        while rows > 1 and topk_workspace(rows, n, topk, logits.dtype) > room:
            rows = (rows + 1) // 2
        for r0 in range(0, m, max(rows, 1)):
            r = slice(r0, min(m, r0 + rows))
            topk_per_row_triton(logits[r], ks[r], ke[r], topk, positions=positions, out=out[r],
                                values=None if values is None else values[r])
        return out, values

    def _select(self, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *,
                positions: str = "relative", out: torch.Tensor | None = None,
                values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused kernel's ``select`` (exact top-k over its candidates): the Triton radix select."""
        from .ops.topk_triton import topk_per_row_triton

        return topk_per_row_triton(logits, ks.int(), ke.int(), topk, positions=positions, out=out,
                                   values=values), values

    def fp8_mqa_topk(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                     cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, topk: int, *,
                     positions: str = "relative", return_values: bool = False,
                     workspace_bytes: int = 256 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused indexer (``ops.mqa_topk_triton``): scoring with a per-row threshold from a strided
        sample, candidates only, an exact selection over them; never the [M, N] matrix.

        Where the ``gluon`` provider runs the Gluon sm_90 logits kernel, the Gluon kernels score
        (``scorer="gluon"``: its logits for the sample, its candidate epilogue for the filter) when
        :data:`GLUON_PREFILL_TOPK` is ``"fused"`` (``"sliced"``: its logits kernel over key slices,
        filtered by a streaming kernel); ``"two-stage"`` is its logits in row chunks within the
        workspace, then the Triton radix select; ``"auto"`` picks one of the last two by the keys
        (:func:`prefill_topk_path`). Elsewhere the portable Triton kernel scores."""
        k, k_scale = kv
        scorer, path = "triton", GLUON_PREFILL_TOPK
        if self.use_gluon and q.get_device() >= 0:
            from .ops.mqa_logits_gluon_sm90 import fp8_mqa_logits_gluon

            if prefill_launcher(True, q.get_device()) is fp8_mqa_logits_gluon:
                if path == "auto":
                    path = prefill_topk_path(k.shape[0], topk, workspace_bytes)
                if path == "two-stage":
                    return self._two_stage_prefill(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, topk, positions,
                                                   return_values, workspace_bytes)
                scorer = "gluon"
        from .ops.mqa_topk_triton import fp8_mqa_topk_triton

        return fp8_mqa_topk_triton(q, k, k_scale.reshape(-1), weights, cu_seqlen_ks, cu_seqlen_ke, topk,
                                   positions=positions, return_values=return_values,
                                   workspace_bytes=workspace_bytes, select=self._select, scorer=scorer,
                                   filter="slices" if scorer == "gluon" and path == "sliced" else "epilogue")

    def _two_stage_prefill(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                           ks: torch.Tensor, ke: torch.Tensor, topk: int, positions: str, return_values: bool,
                           workspace_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        from mqa_core.composed import chunked_prefill_topk

        def logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, ks: torch.Tensor,
                   ke: torch.Tensor) -> torch.Tensor:
            return self.fp8_mqa_logits(q, kv, w, ks, ke)

        return chunked_prefill_topk(logits, self._select_rows, q, kv, weights, ks, ke, topk, positions,
                                    return_values, workspace_bytes)

    def _select_rows(self, logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, positions: str,
                     return_values: bool, budget: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``topk_per_row`` as the core's chunk loops call a selection."""
        return self.topk_per_row(logits, ks, ke, topk, positions=positions, return_values=return_values,
                                 workspace_bytes=budget)

    def fp8_paged_mqa_topk(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                           context_lens: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
                           topk: int, *, schedule: torch.Tensor | None = None, return_values: bool = False,
                           workspace_bytes: int = 256 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Two stages with no host sync (a decode step stays graph-capturable): this provider's paged
        logits for a chunk of whole sequences within the workspace, then the Triton radix select."""
        from mqa_core.composed import chunked_paged_topk

        def logits(q: torch.Tensor, kv_cache: torch.Tensor, w: torch.Tensor, lens: torch.Tensor,
                   tables: torch.Tensor, max_len: int, sched: torch.Tensor | None) -> torch.Tensor:
            return self.fp8_paged_mqa_logits(q, kv_cache, w, lens, tables, max_len, schedule=sched)

        return chunked_paged_topk(logits, self._select_rows, q, kv_cache, weights, context_lens, block_tables,
                                  max_context_len, topk, schedule, return_values, workspace_bytes)


GLUON = MqaKernels(use_gluon=True)
TRITON = MqaKernels(use_gluon=False)
