"""``mqa``: inspect, explain, check and benchmark fp8 MQA-logits providers."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..errors import PluginError, ProviderUnavailableError
from ..settings import ENV_VARS
from .common import UserError, fail

#: subcommand modules, imported only when their command runs (bench pulls in torch and timing).
COMMANDS = ("providers", "explain", "demo", "check", "bench")


def parser() -> argparse.ArgumentParser:
    env = "\n".join(f"  {k:<22} {v}" for k, v in ENV_VARS.items())
    p = argparse.ArgumentParser(
        prog="mqa", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Pick, explain, check and benchmark fp8 MQA-logits kernels (providers).",
        epilog=f"environment:\n{env}\n\nexamples:\n  mqa providers\n  mqa explain --arch gfx950 "
               "--shape 4096,16384,64,128\n  MQA_PROVIDER=torch_ref mqa explain --arch sm_90")
    from .. import __version__

    p.add_argument("--version", action="version", version=f"mqa-core {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not args.command:
        p.print_help()
        return 2
    module = importlib.import_module(f"{__package__}.{args.command}")
    try:
        return int(module.run(args))
    except (UserError, ValueError, TypeError, PluginError, ProviderUnavailableError) as exc:
        return fail(str(exc), 3 if isinstance(exc, ProviderUnavailableError) else 2)
    except KeyboardInterrupt:
        return fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
