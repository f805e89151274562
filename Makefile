# Two jobs, each installing what it needs into the current Python (a venv is up to you).
# TORCH: this CPU machine's build; on a GPU machine run `make ... TORCH=` to keep your own torch.
TORCH ?= torch==2.13.0
PROVIDERS = -e providers/torch_ref -e providers/gluon -e providers/flydsl
PIP = python -m pip install --quiet

.PHONY: demo test test-triton-latest

demo:
	$(PIP) $(TORCH) -e . $(PROVIDERS)
	mqa bench --preset quick
	mqa providers

test:
	$(PIP) $(TORCH) triton==3.6.0 pytest matplotlib ruff mypy -e . $(PROVIDERS) -e examples/third_party_provider
	ruff check mqa_core providers tests examples bench
	mypy
	python -m pytest -q
	$(MAKE) test-triton-latest

# The Triton kernels must keep working on the newest Triton too (the H200 runs 3.6; pip gives newer):
# interpreter numerics and AMD/NVIDIA AOT builds in a venv of their own. Gluon is version-gated there.
test-triton-latest:
	python -m venv .venv-triton-latest
	.venv-triton-latest/bin/python -m pip install --quiet $(TORCH) triton numpy pluggy pytest
	.venv-triton-latest/bin/python -m pip install --quiet --no-deps -e . -e providers/torch_ref -e providers/gluon
	.venv-triton-latest/bin/python -m pytest -q -p no:cacheprovider tests/gluon
