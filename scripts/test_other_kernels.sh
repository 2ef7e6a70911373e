#!/usr/bin/env bash
# The second pass: the tests and notebooks again, this time with another set of CPU kernels.
# PyTorch picks its vectorised kernels (AVX-512, AVX2, NEON, ...) and MKL its code path from the
# CPU it runs on, and they round differently in the last bit; a chaotic training amplifies that
# bit into another result. So an output or an assertion that passes `scripts/test.sh` on the
# machine that wrote it can still fail on a reader's machine. Here ATEN_CPU_CAPABILITY=default
# (PyTorch's portable kernels) and MKL_CBWR=COMPATIBLE (MKL's portable code path) make this
# machine round the way another CPU would, and runs:
# 1. every notebook, compared with its saved outputs by nbval in strict mode, and every test that is
#    not slow (the exact and tight assertions on seeded draws, sums and small trainings);
# 2. the slow tests marked cpu_rounding: each chapter's recorded training re-run from seed 0, and
#    the other slow trainings whose result is asserted.
# Run it after scripts/test.sh (which creates .venv); arguments replace the default selection and go
# to one pytest run, for example one notebook: bash scripts/test_other_kernels.sh chapters/05_multihead.ipynb
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "no .venv: run bash scripts/test.sh first" >&2; exit 2; }
export PYTHONHASHSEED=0 OMP_WAIT_POLICY=PASSIVE
export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-default}" MKL_CBWR="${MKL_CBWR:-COMPATIBLE}"
.venv/bin/python -c "import torch; print('second pass: PyTorch CPU kernels', \
torch.backends.cpu.get_cpu_capability(), '| MKL_CBWR', '$MKL_CBWR')"
PYTEST=(.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --nbval --nbval-current-env --nbval-cell-timeout=600
  --nbval-sanitize-with tests/nbval_sanitize.cfg --ignore=tests/browser --ignore=tests/pdf)
if [ $# -gt 0 ]; then
  "${PYTEST[@]}" --dist loadfile "$@"
  exit
fi
"${PYTEST[@]}" --dist loadfile --durations=15 -m "not slow" tests chapters instructors.ipynb
# one test at a time to either worker: the re-runs of the records sit in few files
"${PYTEST[@]}" --dist load --durations=15 -m "slow and cpu_rounding" tests
