"""What every subcommand shares: user errors, one-line usage errors, JSON output, and the
arch/op/dtype/device/shape arguments, each checked where it is parsed."""

from __future__ import annotations

import argparse
import json
import os
import re
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


#: A value that starts like a negative number but is not one to argparse (``-1,256,32,128``).
_DASH_VALUE = re.compile(r"-\d")


def join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--opt -1,2`` -> ``--opt=-1,2``: argparse reads a token that starts with '-' and is not a plain
    number as an option, so ``--shape -1,256,32,128`` would fail with "expected one argument" instead
    of saying what is wrong with the shape."""
    out: list[str] = []
    for token in argv:
        prev = out[-1] if out else ""
        if _DASH_VALUE.match(token) and prev.startswith("--") and "=" not in prev:
            out[-1] = f"{prev}={token}"
        else:
            out.append(token)
    return out


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors read like every other ``mqa`` error: one line, exit status 2."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        return super().parse_known_args(join_dash_values(sys.argv[1:] if args is None else args), namespace)

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


def writable_path(option: str, path: str) -> None:
    """UserError (exit 2) now, before any measuring, when ``path`` cannot be written: its folder is
    missing or not writable, or it is a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{option} {path}: is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UserError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise UserError(f"{option} {path}: not writable here")


def refuse_named(names: Sequence[str], arch: str, ops: Sequence[str] | None = None) -> None:
    """Before anything runs: UserError (exit 2) for a name that is not installed, and
    ProviderUnavailableError (exit 3), one line, for a provider that cannot serve any op of ``ops``
    it declares (all of its ops when None) on ``arch``, with its own reason (not the preference's)."""
    from ..errors import ProviderUnavailableError
    from ..testing.providers import explain_with, installed_names, spec_named

    refused = []
    for name in names:
        spec = spec_named(name)
        if spec is None:
            raise UserError(f"provider {name!r} is not installed; installed: {', '.join(installed_names()) or 'none'} "
                            "(`mqa providers` lists them)")
        wanted = sorted(spec.ops if ops is None else set(ops) & set(spec.ops))
        # judged as it runs: under MQA_PROVIDER=name, which also picks one claimant by distribution:name
        rows = [explain_with(arch, op=op, MQA_PROVIDER=name).candidate(name) for op in wanted]
        for op, c in zip(wanted, rows):
            if not (c.accepted or c.code == "preference"):
                refused.append(f"provider {name} ({c.origin}, priority {c.priority}) cannot serve "
                               + (f"{op} on " if ops is not None else "") + f"{arch}: rejected [{c.code}] {c.reason}")
                break
    if refused:
        raise ProviderUnavailableError("; ".join(refused))


def providers_for(names: Sequence[str], ops: Sequence[str], device: torch.device, arch: str
                  ) -> dict[tuple[str, str], Provider]:
    """(name, op) -> what an engine gets under ``MQA_PROVIDER=name``, for each op of ``ops`` the named
    provider declares. Checked first by :func:`refuse_named` (exit 2 or 3, one line)."""
    from ..testing.providers import provider_named, spec_named

    refuse_named(names, arch, ops)
    providers = {}
    for name in names:
        spec = spec_named(name)
        assert spec is not None
        for op in ops:
            if op in spec.ops:
                providers[(name, op)] = provider_named(name, arch, op=op)
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
    """Print ``mqa: error: ...``, one printable line (the message's first), and return the exit status."""
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    print(f"mqa: error: {printable(first)}", file=sys.stderr)
    return code
