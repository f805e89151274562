"""``mqa demo``: the provider this machine would use, and one small call checked against fp64."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import add_json, device_or_default, emit


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="explain the choice for this machine and run a small checked example",
                       description="Show which provider serves this machine and why, then compute a "
                                   "small random causal prefill with it and compare with a float64 oracle.")
    p.add_argument("--shape", default="256,512,32,128", metavar="M,N,H,D",
                   help="example size (default %(default)s)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    add_json(p)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..api import explain, get_provider
    from ..arch import arch_of_device
    from ..spec import Problem
    from ..testing.data import calc_diff, make_inputs

    device = device_or_default(args.device)
    problem = Problem.parse(args.shape)
    arch = arch_of_device(device)
    decision = explain(arch, problem=problem)
    provider = get_provider(arch, problem=problem)
    inputs = make_inputs(problem, device=device, window="causal", seed=args.seed)
    t0 = time.perf_counter()
    out = provider.fp8_mqa_logits(*inputs.args(), clean_logits=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    ref = inputs.reference()
    diff = calc_diff(out, ref)
    mask_ok = bool(torch.equal(torch.isinf(out).cpu(), torch.isinf(ref).cpu()))
    data = {"decision": decision.to_dict(), "provider": provider.name, "device": str(device),
            "shape": str(problem), "seconds": seconds, "calc_diff": diff, "mask_identical": mask_ok,
            "passed": diff < 1e-3 and mask_ok}
    text = (f"{decision}\n\nran {provider.name} on {device}, causal prefill {problem}: "
            f"{seconds * 1e3:.1f} ms (first call), calc_diff vs float64 = {diff:.2e}, "
            f"-inf mask {'identical' if mask_ok else 'DIFFERS'}: {'PASS' if data['passed'] else 'FAIL'}")
    emit(data, text, args.json)
    return 0 if data["passed"] else 1
