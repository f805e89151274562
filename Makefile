# Two jobs, each installing what it needs into the current Python (a venv is up to you).
# TORCH: this CPU machine's build; on a GPU machine run `make ... TORCH=` to keep your own torch.
TORCH ?= torch==2.13.0
PROVIDERS = -e providers/torch_ref -e providers/gluon -e providers/flydsl
PIP = python -m pip install --quiet

.PHONY: demo test lint

demo:
	$(PIP) $(TORCH) -e . $(PROVIDERS)
	mqa demo
	mqa providers

test:
	$(PIP) $(TORCH) triton==3.6.0 pytest matplotlib ruff mypy -e . $(PROVIDERS) -e examples/third_party_provider
	ruff check mqa_core providers tests examples
	mypy
	python -m pytest -q
