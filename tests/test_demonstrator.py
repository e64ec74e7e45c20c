"""The demonstrator decides from what it records: under the SmolLM2 experiment's context window the scripted
expert writes into an action only values its recorded prompt shows, and the start check refuses a window the task
does not survive (experiments/opod_smollm2.py, porch_jax/opod/demonstrator.py, porch_jax/opod/preflight.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porch_jax.eval import suite as suite_lib
from porch_jax.eval.suite import TaskSet
from porch_jax.opod.config import ExperimentConfig
from porch_jax.opod.demonstrator import expert_engine
from porch_jax.typed_config import from_dict

ROOT = Path(__file__).resolve().parents[1]


def smollm2_config(**policy) -> ExperimentConfig:
    spec = importlib.util.spec_from_file_location("opod_smollm2", ROOT / "experiments" / "opod_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = module.get_config().to_dict()
    raw["policy"] |= policy
    return from_dict(ExperimentConfig, raw)


def copied_values(action: dict) -> list[str]:
    """The values an orchestrator action copies from what it was told: context facts ("key: value"), bookings to
    cancel, a finished answer's value."""
    args = action.get("arguments") or {}
    values = [line.split(": ", 1)[1] for line in args.get("context") or () if ": " in line]
    values += re.findall(r"cancel cab (R\d+)", str(args.get("subgoal") or ""))
    answer = str(args.get("answer") or "")
    if ": " in answer:
        values.append(answer.split(": ", 1)[1])
    return values


def episodes(cfg: ExperimentConfig, tokenizer, *, sees_context: bool, n: int = 40):
    engine = expert_engine(cfg, tokenizer, window=True)
    if not sees_context:  # the same window, the expert deciding from the whole history (as it did before)
        expert = engine.orchestrator.inner.policy
        expert.sees = "history"
    tasks = suite_lib.task_set(TaskSet(n, 0, "train"), cfg.suite)

    async def play():
        return await asyncio.gather(*(engine.run(t, episode_id=t.task_id) for t in tasks))

    return asyncio.run(play())


def unseen(records) -> tuple[int, int]:
    """(values an action copies that its decision's recorded prompt does not show, values copied)."""
    missing = total = 0
    for r in records:
        for d in r.decisions:
            if d.action is None:
                continue
            shown = "\n".join(str(m.get("content") or "") for m in d.context)
            for v in copied_values(d.action):
                total += 1
                missing += v not in shown
    return missing, total


@pytest.mark.parametrize("window", [384, 768])
def test_every_value_an_expert_action_copies_is_in_its_recorded_prompt(smollm2_dir, window):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    cfg = smollm2_config(context_tokens=window, buckets=(window + 128,), max_len=window + 256)
    missing, total = unseen(episodes(cfg, tokenizer, sees_context=True))
    assert total > 20 and missing == 0, (missing, total)
    if window == 384:  # deciding from the whole history, the same expert copies what the window lost
        missing, total = unseen(episodes(cfg, tokenizer, sees_context=False))
        assert missing > 0, (missing, total)


def test_the_expert_engine_under_the_window_is_the_one_the_experiment_records(smollm2_dir):
    from transformers import AutoTokenizer

    cfg = smollm2_config()
    engine = expert_engine(cfg, AutoTokenizer.from_pretrained(smollm2_dir))
    assert engine.orchestrator.max_prompt_tokens == cfg.policy.context_tokens == 768
    assert engine.orchestrator.inner.policy.sees == "context"
    unwindowed = expert_engine(dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, context_tokens=0)), None)
    assert unwindowed.orchestrator.policy.sees == "history"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_smoke_config_refuses_a_window_the_task_does_not_survive(smollm2_dir, tmp_path):
    """`launch.pipeline` with the :smoke config and a 256-token window exits before any stage, naming the key and
    both success rates."""
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "launch.pipeline", "--config=experiments/opod_smollm2.py:smoke",
         f"--config.run_dir={run_dir}", f"--config.model.init_from={smollm2_dir}", "--config.policy.context_tokens=256"],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0 and not (run_dir / "expert.jsonl").exists(), out[-3000:]
    assert "config.policy.context_tokens" in out and "256 tokens is too short" in out, out[-3000:]
    assert re.search(r"solves 0\.\d\d of 20 validation tasks \(unwindowed: 0\.\d\d\)", out), out[-3000:]
    print(f"\nrefused in {time.monotonic() - t0:.0f} s (imports included)")
