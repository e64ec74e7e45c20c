"""Peak memory and time of the chunked fused reverse KL against the unfused one.

Each variant computes the value of sum_i KL(p_s,i || p_t,i) and its gradient w.r.t. the student
hidden states and head, under ``jax.jit``. Variants:

- ``naive``: logits = hidden @ head for student and teacher, full log-softmaxes, ``jax.grad``.
- ``chunked``: ``chunked_reverse_kl`` with the gradient formed in the forward (the default).
- ``chunked_recompute``: ``chunked_reverse_kl(grad_in_forward=False)``, logits recomputed in the
  backward.

Memory is measured two ways, each variant in a fresh subprocess:

- ``rss``: once the inputs exist, the worker resets the kernel's peak-RSS mark
  (``/proc/self/clear_refs``) and reports its peak resident set over compile and runs minus its
  resident set at the reset: what the step adds on top of its inputs. A baseline subprocess that
  only allocates the inputs is run too (its figure shows the noise floor). Where the reset is not
  allowed, ``ru_maxrss`` minus the baseline's ``ru_maxrss`` is used (and input creation's own
  transient peak can hide a small step).
- ``xla``: the compiled executable's ``memory_analysis()``: temp bytes (live intermediates)
  and temp + output bytes (everything the step adds on top of its arguments).

Time is the median over ``--repeats`` runs after a warm-up, as wall seconds and as process CPU
seconds (all threads); on a shared machine the CPU seconds are the steadier of the two.

Usage::

    python benchmarks/bench_reverse_kl_memory.py                          # 4,096 x 151,936 x 1,024
    python benchmarks/bench_reverse_kl_memory.py --tokens 512 --vocab 32768 --hidden 256 --repeats 2
    python benchmarks/bench_reverse_kl_memory.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ("naive", "chunked", "chunked_recompute")
# Measure this checkout's porch_jax, not whichever copy happens to be installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker(args: argparse.Namespace) -> dict:
    """Runs one variant in this process and returns its measurements."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from porch_jax.train import fused_kl
    from porch_jax.train.losses import token_reverse_kl

    dtype = jnp.dtype(args.dtype)
    rng = np.random.default_rng(0)
    n, h, v = args.tokens, args.hidden, args.vocab

    def normal(shape, scale=1.0):
        x = rng.standard_normal(shape, dtype=np.float32)
        x *= scale
        return jnp.asarray(x, dtype)

    sh, th = normal((n, h)), normal((n, h))
    sw, tw = normal((h, v), h**-0.5), normal((h, v), h**-0.5)
    mask = jnp.ones((n,), jnp.float32)
    jax.block_until_ready((sh, th, sw, tw, mask))
    gc.collect()
    start_rss, reset = _status_bytes("VmRSS"), _reset_peak_rss()
    if args.worker == "inputs":
        return {"variant": "inputs", **_rss_report(start_rss, reset)}

    if args.worker == "naive":

        def loss(sh, sw, th, tw, mask):
            zs = jnp.dot(sh, sw, preferred_element_type=jnp.float32)
            zt = jnp.dot(th, tw, preferred_element_type=jnp.float32)
            return jnp.sum(mask * token_reverse_kl(zs, zt))
    else:
        gif = args.worker == "chunked"

        def loss(sh, sw, th, tw, mask):
            return fused_kl.chunked_reverse_kl(sh, sw, th, tw, mask, chunk_size=args.chunk_size, grad_in_forward=gif)[0]

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    compiled = step.lower(sh, sw, th, tw, mask).compile()
    mem = compiled.memory_analysis()
    xla = {}
    if mem is not None:
        xla = {
            "xla_temp_bytes": int(mem.temp_size_in_bytes),
            "xla_argument_bytes": int(mem.argument_size_in_bytes),
            "xla_output_bytes": int(mem.output_size_in_bytes),
        }
    times, cpu_times = [], []
    value = None
    for i in range(args.repeats + 1):  # the first run warms up and is not timed
        t0, c0 = time.perf_counter(), time.process_time()
        value, grads = compiled(sh, sw, th, tw, mask)
        jax.block_until_ready((value, grads))
        if i:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    return {
        "variant": args.worker,
        **_rss_report(start_rss, reset),
        "seconds": times,
        "cpu_seconds": cpu_times,
        "value": float(value),
        **xla,
    }


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1)) * 1024


def _reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0), so the peak excludes input creation."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_report(start_rss: int, reset: bool) -> dict:
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    out = {"ru_maxrss_bytes": maxrss, "start_rss_bytes": start_rss, "peak_reset": reset}
    if reset:
        out["step_rss_bytes"] = _status_bytes("VmHWM") - start_rss
    return out


def _run_subprocess(variant: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        variant,
        "--tokens",
        str(args.tokens),
        "--hidden",
        str(args.hidden),
        "--vocab",
        str(args.vocab),
        "--dtype",
        args.dtype,
        "--repeats",
        str(args.repeats),
    ]
    if args.chunk_size is not None:
        cmd += ["--chunk-size", str(args.chunk_size)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one CPU device, whatever the caller's test setup
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"variant": variant, "error": f"rc={proc.returncode}: {proc.stderr.strip()[-500:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--chunk-size", type=int, default=None, help="default: auto_chunk_size")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        print(json.dumps(_worker(args)))
        return

    from porch_jax.train.fused_kl import auto_chunk_size

    chunk = args.chunk_size or auto_chunk_size(args.tokens, args.vocab)
    print(
        f"reverse KL value+grad, tokens={args.tokens} hidden={args.hidden} vocab={args.vocab} "
        f"dtype={args.dtype} chunk={chunk} repeats={args.repeats}",
        flush=True,
    )
    baseline = _run_subprocess("inputs", args)
    if "error" in baseline:
        raise SystemExit(f"baseline failed: {baseline['error']}")
    base_rss = baseline["ru_maxrss_bytes"]
    results = []
    for variant in args.variants.split(","):
        r = _run_subprocess(variant, args)
        if "ru_maxrss_bytes" in r:
            r["rss_over_inputs_bytes"] = r.get("step_rss_bytes", r["ru_maxrss_bytes"] - base_rss)
        if "seconds" in r:
            r["median_seconds"] = statistics.median(r["seconds"])
            r["median_cpu_seconds"] = statistics.median(r["cpu_seconds"])
        if "xla_temp_bytes" in r:
            r["xla_temp_plus_output_bytes"] = r["xla_temp_bytes"] + r["xla_output_bytes"]
        results.append(r)
        print(f"  done {variant}: {r.get('error', 'ok')}", flush=True)

    naive = next((r for r in results if r["variant"] == "naive" and "error" not in r), None)
    header = (
        f"{'variant':<18}{'step rss':>11}{'xla temp':>10}{'temp+out':>10}{'wall s':>9}"
        f"{'cpu s':>9}{'rss/naive':>10}{'xla/naive':>10}{'wall/naive':>11}{'cpu/naive':>10}"
        f"{'value':>14}"
    )
    floor = baseline.get("step_rss_bytes")
    print(
        f"inputs-only subprocess: RSS {_gib(baseline['start_rss_bytes'])} GiB after creating the "
        f"inputs, peak {_gib(base_rss)} GiB while creating them, step floor {_gib(floor)} GiB; "
        "memory columns in GiB"
    )
    print(header)
    for r in results:
        if "error" in r:
            print(f"{r['variant']:<18} ERROR {r['error']}")
            continue
        ratios = {
            "rss_ratio_to_naive": None,
            "xla_ratio_to_naive": None,
            "wall_ratio_to_naive": None,
            "cpu_ratio_to_naive": None,
        }
        if naive is not None:
            ratios = {
                "rss_ratio_to_naive": r["rss_over_inputs_bytes"] / naive["rss_over_inputs_bytes"],
                "xla_ratio_to_naive": (r["xla_temp_plus_output_bytes"] / naive["xla_temp_plus_output_bytes"]),
                "wall_ratio_to_naive": r["median_seconds"] / naive["median_seconds"],
                "cpu_ratio_to_naive": r["median_cpu_seconds"] / naive["median_cpu_seconds"],
            }
            r.update(ratios)
        cols = "".join(
            "-".rjust(w) if v is None else f"{v:{w}.3f}" for v, w in zip(ratios.values(), (10, 10, 11, 10), strict=True)
        )
        print(
            f"{r['variant']:<18}{_gib(r['rss_over_inputs_bytes']):>11}"
            f"{_gib(r.get('xla_temp_bytes')):>10}{_gib(r.get('xla_temp_plus_output_bytes')):>10}"
            f"{r['median_seconds']:>9.2f}{r['median_cpu_seconds']:>9.2f}{cols}{r['value']:>14.6g}"
        )
    if args.json:
        out = {
            "config": {k: v for k, v in vars(args).items() if k != "worker"} | {"chunk": chunk},
            "baseline": baseline,
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
