# `make demo` and `make test` work from a fresh clone: they create .venv when it is
# missing and install the project pinned to the CPU torch on this machine's disk.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.distdoctor-installed

.PHONY: demo test bench soak clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/distdoctor demo --all

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/launch.py

# demo --all x10 and one diagnose case x50 under a CPU hog on every core, then the suite x5
# and the property tests once with fresh random examples (--hypothesis-profile=explore)
soak: $(STAMP)
	$(BIN)/python bench/soak.py --load --suite 0 --explore 0
	$(BIN)/python bench/soak.py --demo 0 --diagnose 0

clean:
	rm -rf $(VENV) outputs .pytest_cache .hypothesis soak-failures .coverage .coverage.* htmlcov
