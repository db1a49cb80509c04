# Everything runs inside .venv/, created and filled on first use. A second run installs nothing.
# Override the torch pair for another platform, e.g.
#   make test TORCH_PACKAGES="torch==2.9.1 torchvision==0.24.1"
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Rebuilt when the package's install recipe or TORCH_PACKAGES changes.
INSTALLED := $(VENV)/.lambda_det-installed
TORCH_CHOICE := $(VENV)/.torch-packages
# Default: what .venv/ was last set up with, so a plain `make test` keeps an override.
TORCH_PACKAGES ?= $(or $(shell cat $(TORCH_CHOICE) 2>/dev/null),torch==2.14.1 torchvision==0.29.1)
# The set-up's own output goes to a log; a failing step prints the log's end and stops.
INSTALL_LOG := $(VENV)/install.log
EDITABLE_INSTALL := '.[detectron2,dev,bench]'
logged = $(1) >> $(INSTALL_LOG) 2>&1 || { tail -n 40 $(INSTALL_LOG); echo "failed: $(1) (log: $(INSTALL_LOG))"; exit 1; }

.PHONY: help venv test matrix demo clean-venv always

help:
	@echo "make venv        set up $(VENV)/ (torch, detectron2, lambda_det); then run the tools"
	@echo "                 as $(PY) tools/... or after: source $(VENV)/bin/activate"
	@echo "make test        run the test suite (sets up $(VENV)/ on first use)"
	@echo "make demo        train, evaluate and draw the bundled demo (sets up $(VENV)/ on first use;"
	@echo "                 make demo FORCE=1 trains again, make demo QUICK=1 a short run)"
	@echo "make matrix      the quick suite in one virtualenv per torch / Python entry"
	@echo "make clean-venv  remove $(VENV)/"
	@echo "make help        this list"

venv: $(INSTALLED)

# Rewritten only when TORCH_PACKAGES differs from the last install's, so that a change reinstalls.
$(TORCH_CHOICE): always
	@mkdir -p $(VENV)
	@echo '$(TORCH_PACKAGES)' | cmp -s - $@ || echo '$(TORCH_PACKAGES)' > $@

$(INSTALLED): $(TORCH_CHOICE) setup.py tools/build_detectron2.py \
		tools/detectron2_C_stub.py
	@echo "setting up $(VENV)/ with $(TORCH_PACKAGES), detectron2 and lambda_det (log: $(INSTALL_LOG))"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@: > $(INSTALL_LOG)
	@$(call logged,$(PY) -m pip install --upgrade pip setuptools wheel)
	@$(call logged,$(PY) -m pip install $(TORCH_PACKAGES))
	@$(call logged,$(PY) tools/build_detectron2.py)
	@$(call logged,$(PY) -m pip install --no-build-isolation -e $(EDITABLE_INSTALL))
	@echo "$(VENV)/ is ready"
	@touch $@

# Two pytest-xdist workers, one torch thread each (tests/conftest.py): on 2 cores the suite's
# single-threaded parts (imports, subprocess tools, data loading) then overlap. Tests, not files,
# are shared out: with --dist loadfile one worker would run a file of long end-to-end tests alone
# at the end. tests/ mirrors the package's subpackages; markers slow and e2e (pytest.ini).
test: $(INSTALLED)
	$(PY) -m pytest tests -n 2 --durations=15

# One virtualenv per torch / Python entry under MATRIX_VENVS, the quick suite in each
# (tools/test_matrix.py; docs/ecosystem.md has the table). ENTRIES="torch-2.5 py3.10" runs some.
MATRIX_VENVS ?= .matrix
matrix:
	$(PYTHON) tools/test_matrix.py --venvs $(MATRIX_VENVS) $(ENTRIES)

demo: $(INSTALLED)
	$(PY) tools/demo.py $(if $(FORCE),--force,) $(if $(QUICK),--quick,)

clean-venv:
	rm -rf $(VENV)
