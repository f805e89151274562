"""Install a requirement only when its module is missing; say which one is used either way.

    python .ci/ensure.py MODULE SPEC [--no-deps]

The README's `make demo` and `make test` call this for torch and triton, so that an importable torch
(a CUDA or ROCm build, any version) and the Triton it came with are never replaced: pip runs only
when `import MODULE` fails, and then installs SPEC (this CPU machine's build by default).
"""

from __future__ import annotations

import importlib
import subprocess
import sys


def where(module: object) -> str:
    version = getattr(module, "__version__", "unknown version")
    path = getattr(module, "__file__", None) or "?"
    return f"{version} from {path.rsplit('/', 2)[0] if '/' in path else path}"


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--no-deps"):
        print(__doc__, file=sys.stderr)
        return 2
    name, spec = argv[0], argv[1]
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        print(f"{name}: none importable ({exc}); installing {spec}", flush=True)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", spec, *argv[2:]]
        if subprocess.run(cmd).returncode != 0:
            print(f"{name}: `{' '.join(cmd)}` failed", file=sys.stderr)
            return 1
        importlib.invalidate_caches()
        module = importlib.import_module(name)
        print(f"{name}: using {where(module)} (installed just now)")
        return 0
    print(f"{name}: using {where(module)} (already installed: left as it is)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
