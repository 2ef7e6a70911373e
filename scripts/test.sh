#!/usr/bin/env bash
# Set up .venv, then run every test: lint, the library's unit tests, and every chapter notebook
# executed by nbval in strict mode (fresh outputs compared with the saved ones).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, so two threads do not
# stall each other when other work shares the cores.
export PYTHONHASHSEED=0 OMP_WAIT_POLICY=PASSIVE
.venv/bin/python -m ruff check transformer_lib tests _ext
.venv/bin/python -m pytest --nbval --nbval-current-env --nbval-cell-timeout=600 \
  --nbval-sanitize-with tests/nbval_sanitize.cfg --ignore=tests/browser tests chapters "$@"
