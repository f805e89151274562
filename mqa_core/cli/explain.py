"""``mqa explain``: which provider serves a request, and why every other one does not."""

from __future__ import annotations

import argparse
from typing import Any

from ..api import explain
from .common import add_json, add_request, emit, shape_arg

EXIT_NONE = 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser("explain", help="show the provider decision for an arch, op and shape",
                       description="Judge every installed provider for a request and show the choice. "
                                   f"Exit status {EXIT_NONE} when no provider can serve it.")
    add_request(p, "arch to decide for, e.g. sm_90, gfx950, cpu (default: this machine)")
    p.add_argument("--shape", type=shape_arg, metavar="M,N,H,D",
                   help="problem size, to apply providers' shape limits")
    add_json(p)


def run(args: argparse.Namespace) -> int:
    d = explain(args.arch, op=args.op, dtype=args.dtype, problem=args.shape)
    emit(d.to_dict(), str(d), args.json)
    return 0 if d.chosen else EXIT_NONE
