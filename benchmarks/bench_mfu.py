"""Model FLOPs utilisation of our SFT and OPOD train steps on whatever backend JAX has (CPU, GPU, TPU).

    python benchmarks/bench_mfu.py --shape qwen3_1p7b --dtype bf16 --rows 4 --seq 2048   # a GPU or TPU host
    python benchmarks/bench_mfu.py --shape smollm2_135m --dtype f32,bf16 --rows 4 --seq 512  # this CPU
    python benchmarks/bench_mfu.py --shape tiny --steps 2 --json out.json                    # CI

A model of the named shape (benchmarks/train_steps.py) at random init, its step built as the trainer builds it:
float32 parameters and AdamW moments, matmuls in the compute dtype, the fused LM head, layer remat where asked; for
OPOD the frozen teacher's forward is part of the step. Steps run on a (1, devices, 1) mesh over all local devices
(fsdp), `rows` rows per device. Each step is timed to completion; the median of `--steps` timed steps after
`--warmup` (the first compiles) is reported.

Reported per (method, dtype): tokens per second (trained tokens: every row of every view the student trains on),
model FLOPs per trained token (benchmarks/flops.py: projections, MLP, LM head at the scored positions, attention's
causal half; OPOD adds the teacher's forward), and MFU: achieved model FLOP/s over the peak of the devices used. The
peak is the device's dense bf16 rate from `PEAKS` (GPU and TPU); on a CPU it is this machine's matmul rate in the
run's dtype, measured in the same run and named as such. XLA's own FLOP count of the compiled step is reported
beside ours (it counts the whole attention matrix, elementwise work and the optimizer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flops import forward_flops, matmul_runner  # noqa: E402
from benchmarks.train_steps import METHODS, SHAPES, StepSpec  # noqa: E402

# Dense bf16 peak FLOP/s per chip, from the vendors' data sheets, matched against jax's device_kind (first match).
PEAKS: tuple[tuple[str, str, float], ...] = (
    ("H200", "NVIDIA H200 (SXM)", 989e12),
    ("H100 PCIe", "NVIDIA H100 PCIe", 756e12),
    ("H100", "NVIDIA H100 (SXM)", 989e12),
    ("A100", "NVIDIA A100", 312e12),
    ("v5 lite", "TPU v5e", 197e12),
    ("v5e", "TPU v5e", 197e12),
    ("v5p", "TPU v5p", 459e12),
    ("TPU v5", "TPU v5p", 459e12),
    ("v6 lite", "TPU v6e", 918e12),
    ("v6e", "TPU v6e", 918e12),
)
DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def device_peak(dtype: str) -> tuple[float, str]:
    """(peak FLOP/s of one local device, where the figure comes from)."""
    import jax

    device = jax.local_devices()[0]
    if device.platform == "cpu":
        run, flops = matmul_runner(dtype=dtype)
        seconds = statistics.median(_timed(run) for _ in range(5))
        return (
            flops / seconds,
            f"CPU: this machine's measured {dtype} matmul rate (jitted 2048^3 dot), not a data sheet",
        )
    kind = device.device_kind
    for needle, name, peak in PEAKS:
        if needle.lower() in kind.lower():
            return peak, f"{name} dense bf16 data-sheet peak ({kind!r})"
    raise SystemExit(f"no bf16 peak known for device kind {kind!r}: add it to PEAKS in {__file__}")


def step_flops(spec: StepSpec) -> float:
    """Model FLOPs of one step per row (benchmarks/flops.py): 3x forward for each trained view, 1x for the teacher."""
    return sum(
        (3 if trained else 1) * forward_flops(spec.hf, spec.seq, targets) for targets, trained in spec.views().values()
    )


def trained_tokens(spec: StepSpec) -> int:
    """Tokens per row the student trains on (the teacher's forward does work but trains nothing)."""
    return spec.seq * sum(trained for _, trained in spec.views().values())


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(spec: StepSpec, *, steps: int, warmup: int) -> dict:
    """Times `spec`'s step on a (1, devices, 1) mesh; returns its figures (MFU against this device's peak)."""
    import jax

    from benchmarks.train_steps import build
    from porch_jax.train.mesh import make_mesh

    devices = jax.local_device_count()
    mesh = make_mesh((1, devices, 1))
    built = build(StepSpec(**{**spec.__dict__, "rows": spec.rows * devices}), mesh)
    t0 = time.perf_counter()
    compiled = built.lower().compile()
    compile_s = time.perf_counter() - t0
    xla = (compiled.cost_analysis() or {}).get("flops")

    def one() -> None:
        jax.block_until_ready(built())

    for _ in range(warmup):
        one()
    times = [_timed(one) for _ in range(steps)]
    step_s = statistics.median(times)
    rows = spec.rows * devices
    flops = step_flops(spec) * rows
    tokens = trained_tokens(spec) * rows
    peak, source = device_peak("bf16" if spec.dtype == "bfloat16" else "f32")
    return {
        "shape": spec.shape,
        "layers": spec.hf["num_hidden_layers"],
        "method": spec.method,
        "dtype": spec.dtype,
        "remat": spec.remat,
        "devices": devices,
        "rows": rows,
        "seq": spec.seq,
        "action": spec.action if spec.method == "opod" else None,
        "compile_s": compile_s,
        "step_s": step_s,
        "step_s_all": times,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "model_flops_per_step": flops,
        "model_flops_per_token": flops / tokens,
        "xla_flops_per_step": float(xla) * devices if xla is not None else None,
        "achieved_flops_per_s": flops / step_s,
        "peak_flops_per_s": peak * devices,
        "peak_source": source,
        "mfu": flops / step_s / (peak * devices),
    }


def markdown(results: list[dict]) -> str:
    head = (
        "| shape | method | dtype | remat | devices x rows x seq | step s | tokens/s | model GFLOP/token | MFU | peak |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(
            f"| {r['shape']} ({r['layers']} layers) | {r['method']} | {r['dtype']} | {r['remat']} | "
            f"{r['devices']} x {r['rows'] // r['devices']} x {r['seq']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['model_flops_per_token'] / 1e9:.4g} | {r['mfu']:.1%} | {r['peak_source']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--layers", type=int, default=None, help="cut the shape to this many layers")
    parser.add_argument("--methods", default="sft,opod", help=f"comma-separated, of {METHODS}")
    parser.add_argument("--dtype", default="bf16", help="comma-separated compute dtypes: f32, bf16")
    parser.add_argument("--rows", type=int, default=4, help="rows per device and view")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--action", type=int, default=128, help="OPOD: sampled action tokens per OPD row")
    parser.add_argument("--remat", action="store_true", help="recompute each layer in the backward pass")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps after compiling")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if os.environ.get("JAX_PLATFORMS", "") in ("", "cpu"):  # XLA:CPU's allocator settings, before JAX starts
        from porch_jax.runtime import tune_malloc

        tune_malloc()
    results = []
    for method in args.methods.split(","):
        for dtype in args.dtype.split(","):
            if dtype not in DTYPES:
                parser.error(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
            spec = StepSpec(
                args.shape, method, args.rows, args.seq, args.action, DTYPES[dtype], args.remat, args.layers
            )
            r = measure(spec, steps=args.steps, warmup=args.warmup)
            print(
                f"{r['shape']} {method} {dtype}: {r['step_s']:.3f} s/step, {r['tokens_per_s']:,.0f} tok/s, "
                f"{r['model_flops_per_token'] / 1e9:.4g} GFLOP/token, MFU {r['mfu']:.1%} (compiled in "
                f"{r['compile_s']:.0f} s)",
                flush=True,
            )
            results.append(r)
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps({"load_average_1min": os.getloadavg()[0], "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
