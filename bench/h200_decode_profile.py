"""Nsight Compute counters for the decode op's kernels, mqa-core's Gluon kernel beside DeepGEMM's, on the
ragged batches where the Gluon kernel trails most (issue 11): where its extra microseconds go.

    MQA_GLUON_PDL=0 PYTHONPATH=<DeepGEMM build> ncu --clock-control none \\
        -k "regex:fp8_paged_mqa_logits|_paged_kernel_ws" --launch-skip 8 --launch-count 4 \\
        --section SpeedOfLight --section WarpStateStats --section LaunchStats \\
        --section MemoryWorkloadAnalysis python bench/h200_decode_profile.py

The script builds each batch (``h200_decode_vs_deepgemm.Batch``: contexts spread between half and full,
2-D lengths, no clean pass), calls each kernel ``WARMUP`` times per shape (compilation, descriptor
encodings: 2 shapes x 2 kernels x 2 = the 8 launches skipped above; DeepGEMM's metadata kernel does not
match the filter), then once more per shape and kernel (DeepGEMM, then each Gluon build of
``PROFILE_GLUON``): the four profiled launches (scale both counts with the builds). Each reads its own
step's schedule, as in an engine's decode step: DeepGEMM its metadata, the Gluon kernel
``mqa_core.paged_schedule`` (64-token tiles). Not DeepGEMM's metadata: its rows count 256-token
segments, which the Gluon kernel reads as tiles, so its programs' ranges overlap and some run ~1.8x
longer (round 16: that is what rounds 15's and 16's first profiles of the Gluon kernel measured, 19.7
and 392 us where graph replay shows ~9 and ~235). Without ncu it prints each of those calls' CUDA-event
time. The two kernels' outputs are compared inside the contexts (the decode bench checks both against
the oracle). ``--section SourceCounters`` adds where warps stall, by SASS line (``ncu -i REPORT --page
source --print-source sass --csv``, summed up by ``bench/ncu_stalls.py``).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h200_decode_vs_deepgemm import BLOCK, Batch, D, variant_config  # noqa: E402

#: (B, context, next_n, H): the two shapes furthest behind DeepGEMM in round 10; ``PROFILE_SHAPES``
#: replaces them ("B,C,next_n,H;..."; round 16: the large next_n = 2, H = 64 shapes, where the kernel
#: reads DRAM at 92% of DeepGEMM's rate). Set MQA_GLUON_PDL=0 under ncu (its replay inflates a PDL
#: launch's duration, round 15).
SHAPES = tuple(tuple(int(x) for x in s.split(",")) for s in os.environ["PROFILE_SHAPES"].split(";")) \
    if os.environ.get("PROFILE_SHAPES") else ((32, 4096, 2, 64), (256, 4096, 1, 32))
#: The Gluon builds profiled, as the decode bench's --gluon (``PROFILE_GLUON="ws,ws+stages=12"``).
VARIANTS = os.environ.get("PROFILE_GLUON", "ws").split(",")
#: Calls per kernel before the profiled one (compilation, descriptor encodings).
WARMUP = 2


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the H200)")
        return 2
    import deep_gemm
    from mqa_provider_gluon.ops.paged_mqa_logits_gluon_sm90 import GluonPagedConfig, fp8_paged_mqa_logits_gluon

    import mqa_core

    g = torch.Generator(device="cuda").manual_seed(0)
    sms = deep_gemm.get_num_sms()
    prepared = []
    configs = {name: variant_config(name, {"ws": GluonPagedConfig()}) for name in VARIANTS}
    for b, ctx, next_n, h in SHAPES:
        bt = Batch(b, ctx, "cuda", g, copies=1)
        q = (torch.randn(b, next_n, h, D, generator=g, device="cuda") * 1.5).to(torch.float8_e4m3fn)
        w = torch.randn(b * next_n, h, generator=g, device="cuda") * h ** -0.5
        lens = bt.lens_2d(next_n)
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK, sms)
        split = mqa_core.paged_schedule(lens, sms)  # mqa-core's own units: 64-token tiles
        cache, table = bt.caches[0], bt.tables[0]
        calls = {
            "deepgemm": lambda q=q, c=cache, w=w, lens=lens, t=table, m=meta, n=ctx:
                deep_gemm.fp8_paged_mqa_logits(q, c, w, lens, t, m, n, False),
        }
        for name, cfg in configs.items():  # each Gluon build named, e.g. gluon:ws+stages=12
            calls[f"gluon:{name}"] = lambda q=q, c=cache, w=w, lens=lens, t=table, m=split, n=ctx, cfg=cfg: \
                fp8_paged_mqa_logits_gluon(q, c, w, lens, t, n, False, schedule=m, config=cfg)
        for call in calls.values():
            for _ in range(WARMUP):
                call()
        prepared.append(((b, ctx, next_n, h), calls, lens))
    torch.cuda.synchronize()
    for shape, calls, lens in prepared:
        outs = {}
        for name, call in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            outs[name] = call()
            end.record()
            end.synchronize()
            print(f"B={shape[0]} C={shape[1]} next_n={shape[2]} H={shape[3]} {name}: "
                  f"{start.elapsed_time(end) * 1e3:.1f} us (one eager call)")
        visible = torch.arange(shape[1], device="cuda")[None, :] < lens.reshape(-1, 1)
        for name in outs:
            a, b = outs["deepgemm"][visible], outs[name][visible]
            print(f"  {name} agrees with deepgemm inside the contexts: max |diff| {(a - b).abs().max().item():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
