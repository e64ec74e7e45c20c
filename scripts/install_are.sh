#!/usr/bin/env bash
# Installs Meta ARE (PyPI `meta-agents-research-environments`, the GAIA2 environment) into its own
# virtual environment, with porch_jax itself (no dependencies) so the ARE side can import our
# protocol, engine and GAIA2 adapter.
#
# Why a separate venv: ARE 1.2.0 pins datasets==4.0.0 and so huggingface-hub<1, while
# transformers 5.24.0 needs huggingface-hub>=1.31; it also pins pydantic 2.10 and litellm. The main
# environment runs the ARE side as a subprocess of this venv's python
# (`porch_jax.envs.are.runner`); the modules the ARE side imports (protocol, backends.scripted,
# rollout, envs) need nothing beyond what ARE brings, so porch_jax installs there with --no-deps.
#
# Usage: bash scripts/install_are.sh [VENV_DIR]   (default: .venv-are in the repo root; PORCH_ARE_VENV or
#        the first argument override it; PYTHON picks the interpreter, default python3)
# Idempotent: if the venv already imports ARE at the pinned version and our adapter, nothing is done.
set -euo pipefail

ARE_VERSION="1.2.0"
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV_DIR="${1:-${PORCH_ARE_VENV:-$REPO_ROOT/.venv-are}}"
PYTHON="${PYTHON:-python3}"
VPY="$VENV_DIR/bin/python"

check() {
  "$VPY" - "$ARE_VERSION" <<'PY' >/dev/null 2>&1
import importlib.metadata as md, sys
assert md.version("meta-agents-research-environments") == sys.argv[1]
import porch_jax.envs.are.agent  # noqa: F401  (imports ARE itself)
PY
}

if [[ -x "$VPY" ]] && check; then
  echo "ARE $ARE_VERSION already installed in $VENV_DIR"
  exit 0
fi

start=$SECONDS
[[ -x "$VPY" ]] || "$PYTHON" -m venv "$VENV_DIR"
"$VPY" -m pip install --quiet --disable-pip-version-check "meta-agents-research-environments==$ARE_VERSION"
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps -e "$REPO_ROOT"

if ! check; then
  echo "ARE installed in $VENV_DIR but the import check fails:" >&2
  "$VPY" -c 'import porch_jax.envs.are.agent' >&2 || true
  exit 1
fi
echo "ARE $ARE_VERSION installed in $VENV_DIR in $((SECONDS - start)) s"
