#!/usr/bin/env bash
# Set up .venv, then run every test: lint and format checks, the library's unit tests, and every
# chapter notebook executed by nbval in strict mode (fresh outputs compared with the saved ones).
# The tests and notebooks run on two workers (pytest-xdist); --dist loadfile keeps all the cells
# of one notebook (and all the tests of one file) on the same worker, in order, as nbval needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the production tools chapter 16 is tested against (lm-eval), kept out of
# the reader's set-up (see the file)
.venv/bin/python -m pip install --quiet -r requirements-eval.txt
# bitsandbytes, whose NF4 the book's is proven equal to (tests/test_quantize.py), goes to a folder
# that only that test puts on its path: once installed, peft imports it, and on a CPU with
# AVX512-BF16 its import logs a warning that would change chapter 15's compared output
.venv/bin/python -m pip install --quiet --no-deps --upgrade --target .cache/bitsandbytes "bitsandbytes>=0.46"
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, so two threads do not
# stall each other when other work shares the cores.
export PYTHONHASHSEED=0 OMP_WAIT_POLICY=PASSIVE
# nbgrader, for the graded-course test (tests/test_nbgrader.py), in an environment of its own
# (Python 3.11 or newer; skipped with a message below it).
source scripts/instructors_env.sh
LINTED=(transformer_lib tests benchmarks scripts _ext)
.venv/bin/python -m ruff check "${LINTED[@]}"
.venv/bin/python -m ruff format --check "${LINTED[@]}"
# The book's code is read on its pages: 76 columns fit a code block at a 1280-pixel window
# (chapters/ruff.toml); the instructors' page is formatted the same way.
.venv/bin/python -m ruff format --check chapters
.venv/bin/python -m ruff check --select E501 chapters
.venv/bin/python -m ruff format --check --line-length 76 instructors.ipynb
.venv/bin/python -m ruff check --select E501 --line-length 76 instructors.ipynb
# --durations: the 30 slowest tests and notebook cells, so the suite's cost is visible
.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile --durations=30 \
  --nbval --nbval-current-env --nbval-cell-timeout=600 \
  --nbval-sanitize-with tests/nbval_sanitize.cfg --ignore=tests/browser --ignore=tests/pdf tests chapters instructors.ipynb "$@"
