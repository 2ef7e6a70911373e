#!/usr/bin/env bash
# The second pass: every notebook executed again by nbval in strict mode, this time with another
# set of CPU kernels, and compared with the saved outputs. PyTorch picks its vectorised kernels
# (AVX-512, AVX2, NEON, ...) and MKL its code path from the CPU it runs on, and they round
# differently in the last bit; a chaotic training amplifies that bit into another result. So an
# output that passes `scripts/test.sh` on the machine that saved it can still differ on a
# reader's machine. Here ATEN_CPU_CAPABILITY=default (PyTorch's portable kernels) and
# MKL_CBWR=COMPATIBLE (MKL's portable code path) make this machine round the way another CPU
# would; any compared output that changes fails the run.
# Run it after scripts/test.sh (which creates .venv); extra arguments go to pytest, for example
# one notebook: bash scripts/test_other_kernels.sh chapters/05_multihead.ipynb
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "no .venv: run bash scripts/test.sh first" >&2; exit 2; }
export PYTHONHASHSEED=0 OMP_WAIT_POLICY=PASSIVE
export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-default}" MKL_CBWR="${MKL_CBWR:-COMPATIBLE}"
.venv/bin/python -c "import torch; print('second pass: PyTorch CPU kernels', \
torch.backends.cpu.get_cpu_capability(), '| MKL_CBWR', '$MKL_CBWR')"
if [ $# -eq 0 ]; then
  set -- chapters instructors.ipynb
fi
.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile \
  --nbval --nbval-current-env --nbval-cell-timeout=600 \
  --nbval-sanitize-with tests/nbval_sanitize.cfg "$@"
