#!/bin/sh
# make test-python: the Python package in a fresh virtual environment.
#   sh python/tests/run.sh [VENV]        (default build/pyvenv; run from the repository root)
# Creates VENV anew, pip installs ./python (which builds the library from gemma4.h with cc),
# pytest and numpy from PyPI, runs python/tests, and ends with the harness's closing line
# "N passed, M failed" (make test sums those). Exit status: pytest's, except that "no
# tests collected" (5) and a run without a summary are failures too.
VENV=${1:-build/pyvenv}
PY=${PYTHON3:-python3}
fail() { echo "python/tests/run.sh: $1"; echo "0 passed, 1 failed"; exit 1; }
rm -rf "$VENV"
"$PY" -m venv "$VENV" || fail "'$PY -m venv' failed (Debian: apt-get install python3-venv)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check ./python pytest numpy || fail "pip install ./python pytest numpy failed"
"$VENV/bin/python" -c 'import gemma4, os; print("gemma4", gemma4.__version__, "from", os.path.dirname(gemma4.__file__), "kernels", gemma4.simd_name())' ||
  fail "the installed package does not import"
summary="$VENV/pytest_summary.txt"
rm -f "$summary"
GEMMA4_PYTEST_SUMMARY="$summary" "$VENV/bin/python" -m pytest -q -p no:cacheprovider --ignore=python/tests/torch python/tests
rc=$?
[ -s "$summary" ] || fail "pytest exited $rc without a summary"
[ "$rc" -eq 5 ] && fail "pytest collected no tests"
cat "$summary"
exit "$rc"
