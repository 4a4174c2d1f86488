# Two commands for a fresh clone:  `make demo` (whole pipeline on the shipped sample)  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU wheel, installed before the project so no dependency can pull a CUDA build of torch.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv test test-fast demo clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

test: venv
	$(BIN)/python -m pytest -q --durations=25  # the slowest tests listed: the suite aims at ~20 minutes on 2 cores

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not slurm"

demo: venv
	$(BIN)/python -m hibert.demo $(DEMO_ARGS)

clean:
	rm -rf runs mlruns
