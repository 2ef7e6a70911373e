#!/usr/bin/env bash
# Set up .venv, then run every test: lint, the library's unit tests, and every chapter notebook
# executed by nbval in strict mode (fresh outputs compared with the saved ones).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, so two threads do not
# stall each other when other work shares the cores.
export PYTHONHASHSEED=0 OMP_WAIT_POLICY=PASSIVE
# nbgrader, for the graded-course test (tests/test_nbgrader.py), in an environment of its own.
[ -x .venv-instructors/bin/python ] || "${PYTHON:-python3}" -m venv .venv-instructors
.venv-instructors/bin/python -m pip install --quiet -r requirements-instructors.txt
export NBGRADER_REQUIRED=1
.venv/bin/python -m ruff check transformer_lib tests _ext
.venv/bin/python -m pytest --nbval --nbval-current-env --nbval-cell-timeout=600 \
  --nbval-sanitize-with tests/nbval_sanitize.cfg --ignore=tests/browser tests chapters instructors.ipynb "$@"
