#!/usr/bin/env bash
# Run scikit-learn's own array-API tests against array_api_strict (the reference) and against
# Tensorwire's namespace on a live server on loopback, in one sitting, and compare them case by
# case (tools/sklearn_compare.py): counts, cases that fail on one side only, wall times, and the
# five slowest Tensorwire cases.
#
#   tools/sklearn_suite.sh [PYTHON] [OUT_DIR]
#
# PYTHON has this project's test extra installed (scikit-learn, scipy, array-api-strict is
# installed here if missing: it is the reference). Takes about 4 minutes on a 2-core machine.
set -euo pipefail
py=$(command -v "${1:-python}")  # an absolute path: the runs below change directory
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")
out=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
"$py" -c "import array_api_strict" 2>/dev/null || "$py" -m pip install -q array-api-strict
printf '[pytest]\n' >"$out/pytest.ini"  # scikit-learn's tests as it ships them, not our settings
export SCIPY_ARRAY_API=1 PYTHONPATH="$here/tests:$here"

run() {  # NAMESPACE LABEL
  local start=$SECONDS
  (cd "$out" && SKLEARN_TEST_NS=$1 "$py" -m pytest -c "$out/pytest.ini" -p sklearn_namespace_plugin \
    --pyargs sklearn -q -p no:cacheprovider --junitxml="$out/$2.xml" >"$out/$2.txt" 2>&1) || true
  echo "$2: $(tail -1 "$out/$2.txt") [wall $((SECONDS - start)) s]"
}

run array_api_strict strict
. "$here/tools/_server.sh"
start_server "$py" "$here"
run client.array_api tensorwire
"$py" "$here/tools/sklearn_compare.py" "$out/strict.xml" "$out/tensorwire.xml"
echo "outputs in $out"
