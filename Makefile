# The README's two commands, `make demo` and `make test`, install into the Python environment they
# run in (README: `python -m venv .venv && . .venv/bin/activate` first) and never replace its torch:
# torch is installed only when none is importable, and this repository's packages install with
# --no-deps, so pip has no reason to touch torch. Each prints which torch it used.
PYTHON ?= python
# Installed only when `import torch` fails: this CPU machine's build.
TORCH_SPEC ?= torch==2.13.0
# Installed (--no-deps) only when `import triton` fails; CUDA and ROCm torch bring their own, kept.
TRITON_SPEC ?= triton==3.6.0
# The newest Triton the kernels are also tested with: bumped on purpose, after
# `pip index versions triton` shows a newer release and `make test-triton-latest` passes with it.
TRITON_LATEST = 3.9.0
# Its environment, outside the work tree and reused between runs: a venv layered over this one
# (.ci/overlay_venv.py), so it runs this environment's torch with only Triton replaced.
TRITON_LATEST_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mqa-core/venv-triton-$(TRITON_LATEST)
# This repository's distributions, installed editable. A new provider is one more path here.
PROVIDERS = providers/torch_ref providers/gluon providers/flydsl providers/deepgemm
EXAMPLES = examples/third_party_provider
# What the packages need besides torch (pyproject.toml), and what the tests need.
DEPS = "pluggy>=1.3" numpy
TEST_DEPS = pytest pytest-xdist matplotlib ruff mypy
# pytest workers (pytest-xdist). Two cut the test run on CI's two cores from 8.5 to 5.7 minutes (with
# a warm Triton cache); each worker imports torch and Triton (about 0.5 GB), so not "auto" on a
# large machine. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

PIP = $(PYTHON) -m pip install --quiet
# Editable installs as a path entry (.pth) rather than setuptools' default import hook, so that type
# checkers (mypy, pyright) find mqa_core and the providers from outside the repository too.
EDITABLE = --config-settings editable_mode=compat

.PHONY: demo test torch install test-triton-latest

demo: install
	mqa bench --preset quick
	mqa providers
	@$(PYTHON) .ci/ensure.py torch "$(TORCH_SPEC)"

test: install
	$(PYTHON) .ci/ensure.py triton "$(TRITON_SPEC)" --no-deps
	$(PIP) $(TEST_DEPS)
	$(PIP) --no-deps $(EDITABLE) $(addprefix -e ,$(EXAMPLES))
	$(PYTHON) -m ruff check mqa_core providers tests examples bench
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS)
	$(MAKE) --no-print-directory test-triton-latest
	@$(PYTHON) .ci/ensure.py torch "$(TORCH_SPEC)"

# numpy before torch (torch warns on import without it), torch only if missing, then the packages
# without dependencies.
install:
	$(PIP) $(DEPS)
	@$(PYTHON) .ci/ensure.py torch "$(TORCH_SPEC)"
	$(PIP) --no-deps $(EDITABLE) -e . $(addprefix -e ,$(PROVIDERS))

torch:
	@$(PYTHON) .ci/ensure.py torch "$(TORCH_SPEC)"

# The Triton kernels must keep working on the newest Triton too (the H200 runs the one torch ships):
# interpreter numerics and AMD/NVIDIA AOT builds. Gluon is version-gated there. Tests marked
# `orchestration` (many chunks or programs over kernels the other tests check) run only in `make test`.
test-triton-latest:
	@$(PYTHON) .ci/overlay_venv.py "$(TRITON_LATEST_VENV)" > /dev/null
	"$(TRITON_LATEST_VENV)/bin/python" -m pip install --quiet --no-deps "triton==$(TRITON_LATEST)"
	@"$(TRITON_LATEST_VENV)/bin/python" -c "import triton, torch; print(f'newest-Triton run: triton {triton.__version__}, torch {torch.__version__} ($(TRITON_LATEST_VENV))')"
	"$(TRITON_LATEST_VENV)/bin/python" -m pytest -q -n $(TEST_WORKERS) -p no:cacheprovider -m "not orchestration" tests/gluon
