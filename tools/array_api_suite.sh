#!/usr/bin/env bash
# Run the Array API conformance suite (data-apis/array-api-tests) against plain numpy and against
# a Tensorwire server on loopback, and print both summaries.
#
#   tools/array_api_suite.sh SUITE_CHECKOUT [PYTHON] [MAX_EXAMPLES]
#
# SUITE_CHECKOUT is a git checkout of array-api-tests with its `array-api` submodule present;
# PYTHON has this project, pytest, pytest-json-report, hypothesis and ndindex installed. The suite
# is not part of this repository and this script downloads nothing. Both runs use one hypothesis
# seed; delete the checkout's .hypothesis directory first for runs that replay no old failures.
set -euo pipefail
suite=$(cd "$1" && pwd)
py=${2:-python}
examples=${3:-20}
here=$(cd "$(dirname "$0")/.." && pwd)
export ARRAY_API_TESTS_VERSION=2024.12

run() {
  (cd "$suite" && "$py" -m pytest array_api_tests -q -p no:cacheprovider \
    --max-examples="$examples" --disable-deadline --hypothesis-seed=0 -W ignore 2>&1 | tail -1)
}

echo "numpy:  $(ARRAY_API_TESTS_MODULE=numpy run)"

. "$here/tools/_server.sh"
start_server "$py" "$here"
echo "remote: $(ARRAY_API_TESTS_MODULE=client.array_api run)"
