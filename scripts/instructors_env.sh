# Sourced by scripts/test.sh: the instructors' environment, .venv-instructors, with nbgrader for
# the graded-course test (tests/test_nbgrader.py), apart from the book's .venv. nbgrader 0.9
# needs Python 3.11 or newer: with an older Python (the book itself needs 3.10) this step is
# skipped with a message, NBGRADER_REQUIRED stays unset, and that test is skipped.
instructors_python=${PYTHON:-python3}
instructors_version=$("$instructors_python" -c 'import sys; print("%d %d" % sys.version_info[:2])')
read -r instructors_major instructors_minor <<<"$instructors_version"
if [ "$instructors_major" -gt 3 ] || { [ "$instructors_major" -eq 3 ] && [ "$instructors_minor" -ge 11 ]; }; then
  [ -x .venv-instructors/bin/python ] || "$instructors_python" -m venv .venv-instructors
  .venv-instructors/bin/python -m pip install --quiet -r requirements-instructors.txt
  export NBGRADER_REQUIRED=1
else
  echo "Python $instructors_major.$instructors_minor: the instructors' environment (nbgrader, which needs" \
    "Python 3.11 or newer) is skipped, and tests/test_nbgrader.py with it" >&2
fi
