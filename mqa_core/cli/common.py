"""What every subcommand shares: user errors, JSON output, the arch/op arguments."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..spec import OPS


class UserError(Exception):
    """A mistake in the command line or environment: printed to stderr without a traceback."""


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_request(p: argparse.ArgumentParser, arch_help: str) -> None:
    p.add_argument("--arch", help=arch_help)
    p.add_argument("--op", default="fp8_mqa_logits", choices=OPS, help="the op (default %(default)s)")
    p.add_argument("--dtype", choices=("float8_e4m3fn", "float8_e4m3fnuz"),
                   help="fp8 flavour of q and k (default: any)")


def emit(data: dict[str, Any], text: str, as_json: bool) -> None:
    print(json.dumps(data, indent=2, default=str) if as_json else text)


def fail(message: str, code: int = 2) -> int:
    print(f"mqa: error: {message}", file=sys.stderr)
    return code
