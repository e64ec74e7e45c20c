"""Does a train step fit? XLA's memory analysis of the SFT and OPOD steps compiled ahead of time from abstract
arrays: no weights, nothing allocated but the batch, on a simulated mesh of CPU devices or on the real devices.

    python benchmarks/aot_memory.py                                   # the 9B config on a simulated (1, 8, 1) mesh
    python benchmarks/aot_memory.py --shape tiny --seq 256 --rows 2   # CI's scaled-down form
    python benchmarks/aot_memory.py --platform device --mesh 1,1,1 --layers 4   # on the device this runs on

Defaults are experiments/opod_qwen3_5_9b.py's: Qwen3.5-9B, mesh (1, 8, 1) (fsdp over 8 devices), batch 32 (4 rows
per device), sequences of the largest bucket (4,096 tokens), OPD actions of 512 tokens, bf16 compute over float32
master weights and AdamW moments. For each method, with and without layer remat, the per-device sizes XLA assigns:
arguments (train state, batch, the frozen teacher's parameters), outputs, the part of them aliased to donated
arguments, temporaries (activations, gradients, the fused LM head's chunks, XLA's scratch) and generated code; the
peak a device holds is arguments + outputs - aliased + temporaries. Then the most rows per device that fit each
budget (141 GB, H200; 80 GB, H100), searched over powers of two.

On CPU devices (`--platform cpu`, the default) the figures are XLA:CPU's, an estimate of a GPU's: XLA:GPU fuses
differently (its attention and GEMM fusions, its own buffer assignment and layouts) and runs bf16 natively where
XLA:CPU may widen some bf16 ops to f32 (larger temporaries); the parameter, gradient and optimizer terms are the
same. Remat is not: XLA:CPU drops the optimization barriers jax.checkpoint lowers to (none is left in the compiled
program), so CSE folds the recomputation back into the forward pass and the temporaries with and without remat come
out the same on CPU (a plain 8-layer MLP under jax.checkpoint: 369.1 MB either way). The remat columns are
therefore read on the device: scripts/device_check.sh runs this there for the 9B cut to a few layers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GB = 1e9
BUDGETS_GB = {"H200": 141.0, "H100": 80.0}


def _mesh_shape(text: str) -> tuple[int, int, int]:
    shape = tuple(int(x) for x in text.split(","))
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--mesh: expected data,fsdp,tensor, got {text!r}")
    return shape


def analyse(spec, mesh) -> dict:
    """Per-device byte counts of spec's step compiled for `mesh` from abstract parameters."""
    from benchmarks.train_steps import build

    t0 = time.perf_counter()
    compiled = build(spec, mesh, abstract=True).lower().compile()
    stats = compiled.memory_analysis()
    out = {
        "arguments": stats.argument_size_in_bytes,
        "outputs": stats.output_size_in_bytes,
        "aliased": stats.alias_size_in_bytes,
        "temporaries": stats.temp_size_in_bytes,
        "code": stats.generated_code_size_in_bytes,
    }
    out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    out["compile_s"] = time.perf_counter() - t0
    return out


def largest_fit(spec, mesh, budgets: dict[str, float], first: dict, limit: int) -> dict[str, int]:
    """{budget name: most rows per device (a power of two up to `limit`) whose peak fits}; 0: not even one.

    The peak grows with the rows, so the search walks from the config's rows: up, doubling, while some budget
    still holds and `limit` allows; down, halving, while some budget is exceeded. Each step is one compile (minutes
    at the 9B shape), and no step re-measures a size the walk has already settled.
    """
    import dataclasses

    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    per_device = spec.rows // shards
    peaks = {per_device: first["peak"]}

    def peak(rows: int) -> float:
        if rows not in peaks:
            peaks[rows] = analyse(dataclasses.replace(spec, rows=rows * shards), mesh)["peak"]
        return peaks[rows]

    rows = per_device
    while any(peak(rows) <= b * GB for b in budgets.values()) and rows * 2 <= limit:
        rows *= 2
    rows = per_device
    while rows > 1 and any(peak(rows) > b * GB for b in budgets.values()):
        rows //= 2
    peak(rows)
    return {name: max((r for r, p in peaks.items() if p <= b * GB), default=0) for name, b in budgets.items()}


def size(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.1 * GB else f"{n / 1e6:.1f} MB"


def markdown(rows: list[dict], budgets: dict[str, float]) -> str:
    names = list(budgets)
    head = (
        "| method | remat | rows/device x seq | arguments | outputs | aliased | temporaries | peak / device | "
        + " | ".join(f"fits {n} ({budgets[n]:g} GB)" for n in names)
        + " | "
        + " | ".join(f"most rows/device, {n}" for n in names)
        + " | compile s |"
    )
    lines = [head, "|" + "---|" * (9 + 2 * len(names))]
    for r in rows:
        m = r["memory"]
        lines.append(
            f"| {r['method']} | {r['remat']} | {r['rows_per_device']} x {r['seq']} | "
            + " | ".join(size(m[k]) for k in ("arguments", "outputs", "aliased", "temporaries", "peak"))
            + " | "
            + " | ".join("yes" if m["peak"] <= budgets[n] * GB else "no" for n in names)
            + " | "
            + " | ".join(str(r["largest_rows_per_device"].get(n, "-")) for n in names)
            + f" | {m['compile_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3_5_9b")
    parser.add_argument("--layers", type=int, default=None, help="cut the shape to this many layers")
    parser.add_argument("--mesh", type=_mesh_shape, default=(1, 8, 1), help="data,fsdp,tensor")
    parser.add_argument("--platform", choices=("cpu", "device"), default="cpu", help="cpu: simulated CPU devices")
    parser.add_argument("--rows", type=int, default=4, help="rows per device (the config's micro-batch)")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--action", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--methods", default="sft,opod")
    parser.add_argument("--remat", default="true,false", help="comma-separated: true, false")
    parser.add_argument("--search", type=int, default=64, help="largest rows per device tried (0: no search)")
    parser.add_argument("--budgets", default="H200=141,H100=80", help="name=GB,...")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    devices = args.mesh[0] * args.mesh[1] * args.mesh[2]
    if args.platform == "cpu":  # before JAX starts: simulated devices on the host
        os.environ["JAX_PLATFORMS"] = "cpu"
        flag = f"--xla_force_host_platform_device_count={devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    budgets = {k: float(v) for k, v in (item.split("=") for item in args.budgets.split(","))}

    from benchmarks.train_steps import StepSpec
    from porch_jax.train.mesh import make_mesh

    mesh = make_mesh(args.mesh)
    batch_shards = args.mesh[0] * args.mesh[1]
    results = []
    t0 = time.perf_counter()
    for method in args.methods.split(","):
        for remat in (r.strip().lower() == "true" for r in args.remat.split(",")):
            spec = StepSpec(
                args.shape, method, args.rows * batch_shards, args.seq, args.action, args.dtype, remat, args.layers
            )
            memory = analyse(spec, mesh)
            fits = largest_fit(spec, mesh, budgets, memory, args.search) if args.search else {}
            row = {
                "shape": args.shape,
                "layers": spec.hf["num_hidden_layers"],
                "mesh": list(args.mesh),
                "platform": args.platform,
                "device_kind": mesh.devices.flat[0].device_kind,
                "method": method,
                "remat": remat,
                "rows_per_device": args.rows,
                "seq": args.seq,
                "action": args.action if method == "opod" else None,
                "dtype": args.dtype,
                "memory": memory,
                "largest_rows_per_device": fits,
            }
            results.append(row)
            print(
                f"{method} remat={remat}: peak {size(memory['peak'])}/device (temporaries "
                f"{size(memory['temporaries'])}), most rows/device {fits}; {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    table = markdown(results, budgets)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"wall_s": time.perf_counter() - t0, "results": results}, indent=1))
    if args.md:
        args.md.write_text(table)
    return results


if __name__ == "__main__":
    main()
