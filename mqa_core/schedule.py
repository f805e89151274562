"""A paged call's schedule: the split of a decode batch's key tiles over the GPU's programs, computed
once per decode step instead of in every call.

An engine calls the paged op once per layer with the same context lengths (61 layers in DeepSeek-V3.2),
so the split those lengths imply can be worked out once and handed to every call, as DeepGEMM's
``get_paged_mqa_logits_metadata`` is. The schedule is a hint: a provider that reads one must return
the same logits whatever its values, and providers that do not read one never see it
(:class:`mqa_core.Provider` passes ``schedule`` only to kernel functions that name it).

Layout (DeepGEMM's shape): int32 ``[num_programs + 1, 2]``; row ``i`` is where program ``i`` of an even
split of the batch's 64-token tiles starts, as (sequence, tile within it); the last row is
``(B, 0)``. A sequence's tile count comes from the last column of 2-D lengths (its longest row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily: ``import mqa_core`` must not import it
    import torch

__all__ = ["TILE", "paged_schedule", "schedule_problem"]

#: Tokens per tile of the split (the Gluon kernel's wgmma M; DeepGEMM's sm_90 block).
TILE = 64


def paged_schedule(context_lens: torch.Tensor, num_sms: int | None = None) -> torch.Tensor:
    """The schedule of a decode step's ``context_lens`` (int32 [B] or [B, next_n]) over ``num_sms``
    programs, on that device: int32 ``[num_sms + 1, 2]``. ``num_sms`` None: the multiprocessor count
    of ``context_lens``' GPU, or 1 on a device that is not one (the CPU's providers read no schedule;
    the schedule is a hint that never changes the logits). Device ops only, no host synchronisation:
    capturable in a CUDA graph."""
    import torch

    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != torch.int32 \
            or context_lens.dim() not in (1, 2):
        raise TypeError("paged_schedule: context_lens must be int32 [B] or [B, next_n]; "
                        f"got {describe(context_lens)}")
    if num_sms is None:
        num_sms = (torch.cuda.get_device_properties(context_lens.device).multi_processor_count
                   if context_lens.device.type == "cuda" else 1)
    if not isinstance(num_sms, int) or isinstance(num_sms, bool) or not 1 <= num_sms < 2**31:
        raise TypeError(f"paged_schedule: num_sms must be a positive int below 2**31; got {num_sms!r}")
    longest = context_lens if context_lens.dim() == 1 else context_lens.max(dim=1).values
    tiles = (longest.long().clamp(min=0) + TILE - 1) // TILE
    ends = torch.cumsum(tiles, 0)
    total = ends[-1:] if ends.numel() else torch.zeros(1, dtype=torch.long, device=tiles.device)
    starts = torch.arange(num_sms + 1, device=tiles.device) * total // num_sms
    seq = torch.searchsorted(ends, starts, right=True)
    before = torch.cat([torch.zeros(1, dtype=torch.long, device=tiles.device), ends])[seq]
    at = torch.where(seq < tiles.numel(), starts - before, 0)
    return torch.stack([seq, at], dim=1).to(torch.int32)


def schedule_problem(schedule: Any, device: Any) -> str | None:
    """None when ``schedule`` may go with a call on ``device`` (None, or int32 [programs + 1, 2] with
    programs >= 1 on that device), else what is wrong with it. Only the layout: values are a hint."""
    if schedule is None:
        return None
    import torch

    if not isinstance(schedule, torch.Tensor) or schedule.dtype != torch.int32 or schedule.dim() != 2 \
            or schedule.shape[1] != 2 or schedule.shape[0] < 2:
        return f"schedule must be None or int32 [num_programs + 1, 2] (paged_schedule); got {describe(schedule)}"
    if schedule.device != device:
        return f"schedule is on {schedule.device}, the call's tensors on {device}"
    return None


def describe(t: Any) -> str:
    """An argument as error messages name it: dtype, shape and device of a tensor, else its type."""
    import torch

    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)} on {t.device}"
    return type(t).__name__
