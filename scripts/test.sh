#!/usr/bin/env bash
# The README's test command: installs the package with its test extras, then runs every test
# (fast unit tests and the slower integration tests marked `slow`). Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the quick loop.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
exec python -m pytest "$@"
