"""``mqa``: inspect, explain, check and benchmark fp8 MQA-logits providers.

Every user error (bad arguments, a device this machine lacks, a bad ``MQA_*`` value, an output
that cannot be written) exits with status 2 and one line on stderr, never a traceback, before any
measuring; "no provider can serve this" exits 3, also in one line (``mqa explain`` prints the trace).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from ..errors import PluginError, ProviderUnavailableError
from ..names import printable
from ..settings import ENV_VARS
from .common import Parser, UserError, fail, resolve_device

#: subcommand modules, imported only when their command runs (bench pulls in torch and timing).
COMMANDS = ("providers", "explain", "demo", "check", "bench", "tune")


def parser() -> argparse.ArgumentParser:
    env = "\n".join(f"  {k:<24} {v}" for k, v in ENV_VARS.items())
    p = Parser(
        prog="mqa", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pick, explain, check and benchmark fp8 MQA-logits kernels (providers).",
        epilog=f"environment:\n{env}\n\nexamples:\n  mqa providers\n  mqa explain --arch gfx950 "
               "--shape 4096,16384,64,128\n  mqa explain --arch gfx942 --dtype float8_e4m3fn,float8_e4m3fnuz\n"
               "  MQA_PROVIDER=torch_ref mqa explain --arch sm_90\n"
               "  MQA_PROVIDER=mqa-provider-torch-ref:torch_ref mqa demo")
    from .. import __version__

    p.add_argument("--version", action="version", version=f"mqa-core {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").add_parser(sub)
    return p


def _one_line_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                      line: Any = None) -> None:
    text = printable(f"mqa: warning: {message}")  # a plugin's own warnings come through here too
    print(text.replace("mqa: warning: mqa_core: ", "mqa: warning: "), file=sys.stderr)


def unavailable_line(exc: ProviderUnavailableError) -> str:
    """"Nothing can serve this" in one line: the decision's verdict, and the command that shows every
    provider's reason (the trace itself is ``mqa explain``'s output, not an error message)."""
    d = getattr(exc, "decision", None)
    if d is None:
        return str(exc).strip().splitlines()[0]
    ask = f"--arch {d.arch} --op {d.op}"
    if d.problem is not None:
        ask += f" --shape {d.problem.m},{d.problem.n},{d.problem.h},{d.problem.d}"
    if d.dtype is not None:
        ask += f" --dtype {','.join(d.dtype)}"
    where = f"{d.op} on {d.arch}" + (f" ({d.problem})" if d.problem is not None else "")
    return f"no provider can serve {where}: {d.why} (mqa explain {ask} shows every provider's reason)"


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not args.command:
        p.print_help()
        return 2
    # Plugin problems are reported once, as warnings of one line each (not also through logging).
    log = logging.getLogger("mqa_core")
    quiet, propagate, show = logging.NullHandler(), log.propagate, warnings.showwarning
    log.addHandler(quiet)
    log.propagate = False
    warnings.showwarning = _one_line_warning
    try:
        if getattr(args, "device", None) is not None:
            args.device = resolve_device(args.device)
        module = importlib.import_module(f"{__package__}.{args.command}")
        return int(module.run(args))
    except ProviderUnavailableError as exc:
        return fail(unavailable_line(exc), 3)
    except (UserError, ValueError, TypeError, PluginError) as exc:
        return fail(str(exc), 2)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    finally:
        warnings.showwarning = show
        log.removeHandler(quiet)
        log.propagate = propagate


if __name__ == "__main__":
    sys.exit(main())
