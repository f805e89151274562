"""A virtual environment layered over the current one: its own packages first, then everything the
current interpreter sees (torch, mqa-core's editable install, pytest...), nothing copied.

    python .ci/overlay_venv.py DIR

`make test-triton-latest` puts a newer Triton in such an environment and runs the kernel tests with
the current torch; the tutorial's test installs the tutorial's provider into one, so neither touches
the environment it started from. Re-running refreshes the layering (the venv itself is reused).
Console scripts the layers need (`pip`, `pytest`, `mqa`) run this environment's Python.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

SCRIPTS = {
    "pip": "from pip._internal.cli.main import main",
    "pytest": "from pytest import main",
    "mqa": "from mqa_core.cli.main import main",
}


def parent_site_dirs() -> list[str]:
    """The site directories of the running interpreter, in its order."""
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def make_overlay(path: str | os.PathLike[str]) -> Path:
    """Create (or refresh) the overlay at ``path``; returns its python."""
    root = Path(path)
    python = root / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in parent_site_dirs() if d != purelib]
    Path(purelib, "zz-overlay-parent.pth").write_text("\n".join(lines) + "\n")
    for name, line in SCRIPTS.items():
        script = root / "bin" / name
        script.write_text(f"#!{python}\nimport sys\n{line}\nsys.exit(main())\n")
        script.chmod(0o755)
    return python


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(make_overlay(sys.argv[1]))
