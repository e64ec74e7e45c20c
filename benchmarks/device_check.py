"""The first-accelerator check: what a GPU or TPU host does with this code, in one command of at most ~5 minutes,
with no network and no weights (scripts/device_check.sh runs it).

1. The machine: jax's version, backend and devices, and whether a CUDA or TPU plugin is installed. Without an
   accelerator it stops with a one-line message (``DEVICE_CHECK_CPU=1`` runs the CPU form instead).
2. MFU of the SFT and OPOD steps at the Qwen3-1.7B shape in bf16 (benchmarks/bench_mfu.py).
3. The embedded sampler's decode throughput at batch 32, 128 new tokens (benchmarks/bench_decode.py).
4. XLA's memory analysis of the 9B config's steps cut to a few layers (benchmarks/aot_memory.py), compiled for the
   real device and, beside it, for a simulated CPU device: the real figures and how far XLA:CPU's estimate (the
   README's 9B table) is from them.

Each part runs in its own process (a part that fails or runs out of memory is a line in the report, not the end of
the check) with a time limit. Written to OUT: device_check.json (every figure) and device_check.md (the tables).
The CPU form (``--cpu``) runs the same parts at the tiny shape, for CI (the memory analysis without remat).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_cuda12_pjrt", "jax_cuda13_pjrt", "libtpu")


def machine() -> dict:
    """jax's view of this machine; raises SystemExit with one line where jax is missing."""
    if importlib.util.find_spec("jax") is None:
        raise SystemExit("device_check: jax is not installed here (pip install -e . on this machine's Python)")
    import jax

    try:
        devices = jax.devices()
    except RuntimeError as e:  # a plugin that is present but cannot start its backend
        raise SystemExit(f"device_check: jax found no usable backend: {str(e).splitlines()[0]}") from None
    return {
        "date": time.strftime("%Y-%m-%d"),
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", "?"),
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.device_kind}" for d in devices],
        "device_count": len(devices),
        "plugins": {p: importlib.util.find_spec(p) is not None for p in PLUGINS},
        "memory_bytes_limit": (devices[0].memory_stats() or {}).get("bytes_limit") if devices else None,
    }


def part(name: str, argv: list[str], json_path: Path, timeout_s: float, env: dict[str, str]) -> dict:
    """One benchmark in its own process; {"ok", "seconds", "result" | "error"}."""
    t0 = time.perf_counter()
    cmd = [sys.executable, *argv, "--json", str(json_path)]
    print(f"== {name}: {' '.join(argv)}", flush=True)
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": f"over its {timeout_s:.0f} s limit"}
    seconds = time.perf_counter() - t0
    print(done.stdout[-3000:], flush=True)
    if done.returncode != 0 or not json_path.is_file():
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        return {"ok": False, "seconds": seconds, "error": lines[-1] if lines else f"exit status {done.returncode}"}
    return {"ok": True, "seconds": seconds, "result": json.loads(json_path.read_text())}


def plan(cpu: bool, memory_limit: float | None) -> list[tuple[str, list[str], float, dict[str, str]]]:
    """(name, arguments, time limit s, extra environment) of each part."""
    if cpu:
        # The CPU form exercises every part on CI's shared cores, so its limits guard against a hang, not a slow
        # machine; its memory analysis compiles only what the MFU part timed (remat off: that program is in the
        # shared compilation cache at 2 rows), since the remat comparison has its own test.
        limit = 150
        tiny = ["--shape", "tiny", "--mesh", "1,1,1", "--rows", "1", "--seq", "128", "--action", "32",
                "--remat", "false"]  # fmt: skip
        return [
            ("mfu", ["benchmarks/bench_mfu.py", "--shape", "tiny", "--dtype", "bf16", "--rows", "2", "--seq", "128",
                     "--action", "32", "--steps", "2"], limit, {}),
            ("decode", ["benchmarks/bench_decode.py", "--shape", "tiny", "--batch", "8", "--new", "16",
                        "--repeats", "2"], limit, {}),
            ("memory_device", ["benchmarks/aot_memory.py", *tiny, "--platform", "device", "--search", "2"], limit, {}),
            ("memory_cpu", ["benchmarks/aot_memory.py", *tiny, "--platform", "cpu", "--search", "0"], limit, {}),
        ]  # fmt: skip
    rows = "4" if (memory_limit or 0) >= 120e9 else "2"  # 1.7B without remat: activations of 4 x 2048 fit an H200
    nine = ["benchmarks/aot_memory.py", "--shape", "qwen3_5_9b", "--layers", "4", "--mesh", "1,1,1", "--rows", "1",
            "--seq", "4096", "--action", "512"]  # fmt: skip
    return [
        ("mfu", ["benchmarks/bench_mfu.py", "--shape", "qwen3_1p7b", "--dtype", "bf16", "--rows", rows, "--seq", "2048",
                 "--action", "512", "--steps", "3"], 210, {}),
        ("decode", ["benchmarks/bench_decode.py", "--shape", "qwen3_1p7b", "--batch", "32", "--new", "128",
                    "--dtype", "bf16", "--repeats", "3"], 90, {}),
        ("memory_device", [*nine, "--platform", "device", "--search", "8"], 120, {}),
        ("memory_cpu", [*nine, "--platform", "cpu", "--search", "0"], 120, {"JAX_PLATFORMS": "cpu"}),
    ]  # fmt: skip


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# Device check, {m['date']}",
        "",
        f"jax {m['jax']}, backend {m['backend']}, {m['device_count']} device(s): {', '.join(sorted(set(m['devices'])))}; "
        f"plugins: {', '.join(p for p, ok in m['plugins'].items() if ok) or 'none'}",
        "",
    ]
    for name, out in report["parts"].items():
        lines.append(f"## {name} ({out['seconds']:.0f} s)")
        lines.append("")
        if not out["ok"]:
            lines += [f"failed: {out['error']}", ""]
            continue
        r = out["result"]
        if name == "mfu":
            from benchmarks.bench_mfu import markdown as mfu_table

            lines.append(mfu_table(r["results"]))
        elif name == "decode":
            lines += [
                "| shape | dtype | batch x new tokens | tok/s | ms per decode step | first call s |",
                "|---|---|---|---|---|---|",
                f"| {r['shape']} ({r['layers']} layers) | {r['dtype']} | {r['batch']} x {r['new_tokens']} | "
                f"{r['tokens_per_s']:,.0f} | {r['s_per_decode_step'] * 1e3:.2f} | {r['first_call_s']:.0f} |",
                "",
            ]
        else:
            from benchmarks.aot_memory import markdown as memory_table

            rows = r["results"]
            lines.append(
                f"{rows[0]['shape']} cut to {rows[0]['layers']} layers, compiled for {rows[0]['device_kind']}:"
            )
            lines.append("")
            lines.append(memory_table(rows, {"H200": 141.0, "H100": 80.0}))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/device_check"))
    parser.add_argument("--cpu", action="store_true", help="the CPU form at the tiny shape (CI)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if args.cpu:
        env["JAX_PLATFORMS"] = "cpu"
        os.environ["JAX_PLATFORMS"] = "cpu"
    info = machine()
    print(json.dumps(info, indent=1), flush=True)
    if not args.cpu and info["backend"] not in ("gpu", "tpu", "cuda", "rocm"):
        plugins = [p for p, ok in info["plugins"].items() if ok]
        raise SystemExit(
            f"device_check: no GPU or TPU here (jax's backend is {info['backend']!r}, plugins found: "
            f"{', '.join(plugins) or 'none'}); DEVICE_CHECK_CPU=1 runs the CPU form"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {}
    for name, argv_, limit, extra in plan(args.cpu, info["memory_bytes_limit"]):
        parts[name] = part(name, argv_, args.out / f"{name}.json", limit, {**env, **extra})
    report = {"machine": info, "cpu_form": args.cpu, "wall_s": time.perf_counter() - t0, "parts": parts}
    (args.out / "device_check.json").write_text(json.dumps(report, indent=1))
    (args.out / "device_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"device_check: {sum(p['ok'] for p in parts.values())}/{len(parts)} parts ran; {report['wall_s']:.0f} s; "
          f"written to {args.out}/device_check.{{json,md}}")  # fmt: skip
    return 0 if all(p["ok"] for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
