"""What every subcommand shares: user errors, one-line usage errors, JSON output, and the
arch/op/dtype/device/shape arguments, each checked where it is parsed."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..names import printable
from ..spec import OPS, Pair, Problem, parse_dtypes

if TYPE_CHECKING:
    import torch

    from ..provider import Provider


class UserError(Exception):
    """A mistake in the command line or environment: printed to stderr without a traceback."""


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors read like every other ``mqa`` error: one line, exit status 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def dtype_arg(text: str) -> str | Pair:
    """``Q`` (q and k alike) or ``Q,K``; full torch names or short ones (e4m3fn, fnuz)."""
    try:
        names = parse_dtypes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return names[0] if len(names) == 1 else (names[0], names[1])


def shape_arg(text: str) -> Problem:
    """``M,N,H,D`` for ``--shape``; the reason, not argparse's generic 'invalid value', on error."""
    try:
        return Problem.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_request(p: argparse.ArgumentParser, arch_help: str) -> None:
    p.add_argument("--arch", help=arch_help)
    p.add_argument("--op", default="fp8_mqa_logits", choices=OPS, help="the op (default %(default)s)")
    p.add_argument("--dtype", type=dtype_arg, metavar="Q[,K]",
                   help="fp8 flavour of q (and k), or a q,k pair, e.g. float8_e4m3fn,float8_e4m3fnuz "
                        "(default: any)")


def resolve_device(text: str) -> str:
    """The canonical spelling of a ``--device`` this machine has; UserError saying why otherwise."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"--device {text!r} is not a torch device: use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise UserError(f"--device {text}: mqa runs on cpu and cuda (NVIDIA or ROCm) devices, not {dev.type}")
    if not torch.cuda.is_available():
        built = ("" if torch.version.cuda or getattr(torch.version, "hip", None)
                 else ", a build without CUDA or ROCm")
        raise UserError(f"--device {text}: no CUDA or ROCm device is available here (torch {torch.__version__}"
                        f"{built}); use --device cpu")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise UserError(f"--device {text}: this machine has {count} device(s), cuda:0 to cuda:{count - 1}")
    return str(dev)


def device_or_default(text: str | None) -> torch.device:
    """``--device`` (already checked by :func:`resolve_device`), or the GPU when there is one."""
    import torch

    return torch.device(text or ("cuda" if torch.cuda.is_available() else "cpu"))


def timed_calls(args: argparse.Namespace, gpu: bool, *, gpu_repeat: int) -> tuple[int, int]:
    """(warm-up calls, timed calls) from ``--warmup`` and ``--repeat``: 5 and ``gpu_repeat`` on a GPU,
    1 and 5 on the CPU, unless given."""
    if (args.repeat is not None and args.repeat < 1) or (args.warmup is not None and args.warmup < 0):
        raise UserError("--repeat must be >= 1 and --warmup >= 0")
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    return warmup, args.repeat or (gpu_repeat if gpu else 5)


def providers_for(names: Sequence[str], ops: Sequence[str], device: torch.device, arch: str
                  ) -> dict[tuple[str, str], Provider]:
    """(name, op) -> what an engine gets under ``MQA_PROVIDER=name``, for each op of ``ops`` the named
    provider declares. UserError for a name that is not installed or an op it cannot serve here."""
    from ..errors import ProviderUnavailableError
    from ..testing.providers import provider_named, spec_named

    providers = {}
    for name in names:
        spec = spec_named(name)
        if spec is None:
            raise UserError(f"provider {name!r} is not installed (see `mqa providers`)")
        for op in ops:
            if op in spec.ops:
                try:
                    providers[(name, op)] = provider_named(name, arch, op=op)
                except ProviderUnavailableError as exc:
                    raise UserError(f"provider {name} cannot serve {op} on {device} ({arch}):\n{exc}") from None
    return providers


def emit(data: dict[str, Any], text: str, as_json: bool) -> None:
    """``data`` as JSON (plain data; JSON escapes every control character), or ``text`` with each line
    printable (:func:`mqa_core.names.printable`: plugin-supplied text cannot move the cursor)."""
    print(json.dumps(data, indent=2, default=str) if as_json else safe_lines(text))


def safe_lines(text: str) -> str:
    """Each line of ``text`` printable: the line breaks are ours, every other control character shown
    as an escape."""
    return "\n".join(printable(line) for line in text.split("\n"))


def fail(message: str, code: int = 2) -> int:
    lines = [printable(line) for line in message.strip().split("\n")]
    first = lines[0] if message.strip() else "failed"
    print(f"mqa: error: {first}", file=sys.stderr)
    for line in lines[1:]:  # a decision trace (exit 3) keeps its table; user errors are one line
        print(line, file=sys.stderr)
    return code
