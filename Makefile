SHELL := /bin/bash

# `make demo` and `make test` work from a fresh clone: they create .venv when it is
# missing and install the project pinned to the CPU torch on this machine's disk.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.distdoctor-installed

.PHONY: demo test check lint typecheck bench soak clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/distdoctor demo --all

test: lint $(STAMP)
	$(BIN)/python -m pytest

# the quick loop before each commit: lint, types, and the tests that start no rank and
# no fresh interpreter (--tier unit; conftest.py says what each tier is)
check: lint $(STAMP)
	$(BIN)/python -m pytest --tier unit

# ruff (lint and import order) and mypy, on the whole tree. mypy reads the package as it is
# installed, under its one name: harness/, checks/ and faults/ are copied into
# build/typecheck/distdoctor/ (the editable install maps them with an import hook, which
# mypy does not run), and the copy's paths are written back as the repository's.
lint: $(STAMP)
	$(BIN)/ruff check harness checks faults tests bench examples conftest.py
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck
	cp -r harness build/typecheck/distdoctor
	cp -r checks faults build/typecheck/distdoctor/
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p distdoctor \
		| sed -e 's#^distdoctor/checks/#checks/#' -e 's#^distdoctor/faults/#faults/#' \
		      -e 's#^distdoctor/#harness/#'; exit $${PIPESTATUS[0]}

bench: $(STAMP)
	$(BIN)/python bench/launch.py

# demo --all x10 and one diagnose case x50 under a CPU hog on every core, then the suite x5
# and the property tests once with fresh random examples (--hypothesis-profile=explore)
soak: $(STAMP)
	$(BIN)/python bench/soak.py --load --suite 0 --explore 0
	$(BIN)/python bench/soak.py --demo 0 --diagnose 0

clean:
	rm -rf $(VENV) outputs .pytest_cache .hypothesis soak-failures .coverage .coverage.* htmlcov
