#!/usr/bin/env bash
# The first-accelerator check (benchmarks/device_check.py): one command on a GPU or TPU host, at most ~5 minutes, no
# network, no weights. Prints the machine (jax, backend, devices, CUDA/TPU plugins), then MFU of the SFT and OPOD
# steps at the Qwen3-1.7B shape, the embedded sampler's decode throughput and XLA's memory analysis of the 9B
# config cut to a few layers; writes device_check.json and device_check.md to $OUT (default runs/device_check).
#
#   bash scripts/device_check.sh                     # on the accelerator host
#   DEVICE_CHECK_CPU=1 bash scripts/device_check.sh  # the same parts at the tiny shape on CPU (CI)
set -uo pipefail
cd "$(dirname "$0")/.."
python=$(command -v python || command -v python3) || { echo "device_check: no python on PATH"; exit 1; }
args=()
[ "${DEVICE_CHECK_CPU:-0}" = "1" ] && args+=(--cpu)
exec "$python" benchmarks/device_check.py --out "${OUT:-runs/device_check}" "${args[@]}"
