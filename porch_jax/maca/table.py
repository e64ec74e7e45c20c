"""MACA's real-agent table: the paper's six benchmarks x MACA, its Table 3 ablations and the baselines (Vanilla,
CoT, Self-Consistency x5, Self-Refine, Table 11's three LLM routers, multi_agent.py's multi-agent systems and
adaptive.py's MaAS and Puppeteer, which learn on each benchmark's training tasks first), every agent one served
model, sized for a CPU.

Each benchmark is one MACA experiment (`experiment.run`, in RUN_DIR/<benchmark>) on its recorded CPU subset of the
Table 4 split (`world.subset`: 30 test tasks, 16 training tasks), with the family's agent pool (paper Table 5).
GraphSpec's prior is learned on every benchmark. GRPO trains the learned systems on at most two benchmarks
(`grpo_on`); a benchmark of the same family runs those trained policies (`MacaConfig.policy_from`), and a benchmark
whose family has none runs pi_theta at its initialisation (GRPO iterations 0), each row saying which.

Every system of every benchmark reaches the model through one `CachedBackend` (the caller builds it): an exact
response cache keyed by model, messages and sampling, so the systems share the answers they have in common and a
rerun after a crash replays what was already answered. With each benchmark's experiment resuming its own prior
and training checkpoints, the whole table resumes. The baselines keep no state of their own, so they may change on
a rerun (`claim_table_dir`): a finished benchmark runs just the configured baselines its results lack
(`experiment.add_baselines`: replayed where the cache holds their calls) and adds their rows; the systems its
results hold are read, not rerun. The response cache counts each baseline's calls under its own scope, so the log
says which systems reached the model and how many calls they made, and table.json keeps what the call added and
its seconds (`added_baselines`).

`run_table` writes RUN_DIR/table.json, table.md (accuracy or pass@1 with Wilson 95% intervals, tokens per task,
the routers' invalid-action rates, chance levels) and table.png.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from porch_jax.backends import Backend
from porch_jax.backends.cache import CacheStats, counts_since, scope_counts
from porch_jax.envs.benchmarks import BENCHMARKS, load_tasks
from porch_jax.maca.config import MacaConfig
from porch_jax.maca.settings import ADAPTIVE, training_scope
from porch_jax.progress import Stages
from porch_jax.rollout.pairs import wilson
from porch_jax.serving import ServerConfig
from porch_jax.typed_config import RunDirError, check, claim_run_dir, to_dict

BENCHMARK_ORDER = ("humaneval", "mbpp", "mmlu_pro", "arc_challenge", "svamp", "gsm_hard")  # the paper's Table 1
LEARNED = ("maca", "no_z_prior", "no_p_prior", "no_graphspec")  # the Table 3 systems GRPO trains


@dataclasses.dataclass(frozen=True)
class AgentSource:
    """Where the agents run. "hf": `path`, a Hugging Face folder (empty: SmolLM2-135M-Instruct from the package
    index), served by vLLM (`serve`) for the run; "endpoint": `maca.backend.endpoint` as configured (then
    `model_id` names the model for the response cache's keys)."""

    kind: str = "hf"
    path: str = ""
    serve: ServerConfig = ServerConfig(device="auto", served_model_name="agents")
    model_id: str = ""

    def __post_init__(self) -> None:
        check(self.kind in ("hf", "endpoint"), "kind", f"must be 'hf' or 'endpoint', got {self.kind!r}")
        check(
            self.kind != "endpoint" or bool(self.model_id),
            "model_id",
            "an endpoint's replies are cached under the model_id you give (e.g. the model's name and revision)",
        )


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """The table's run. `maca` is every benchmark's experiment config; per benchmark its run_dir, world.benchmark,
    pool (the family's and the auxiliary roles), policy_from and, where no policy of the family is trained,
    grpo.iterations (0) are set here."""

    run_dir: str
    benchmarks: tuple[str, ...] = BENCHMARK_ORDER
    grpo_on: tuple[str, ...] = ("gsm_hard", "arc_challenge")  # the paper's Table 3 pair
    maca: MacaConfig = MacaConfig(run_dir="(per benchmark)")
    agents: AgentSource = AgentSource()
    cache_file: str = "responses.jsonl"

    def __post_init__(self) -> None:
        unknown = [b for b in self.benchmarks if b not in BENCHMARKS]
        check(not unknown, "benchmarks", f"unknown {unknown}; choose from {sorted(BENCHMARKS)}")
        check(len(set(self.benchmarks)) == len(self.benchmarks), "benchmarks", "each benchmark once")
        check(len(self.grpo_on) <= 2, "grpo_on", f"GRPO trains on at most two benchmarks, got {self.grpo_on}")
        stray = [b for b in self.grpo_on if b not in self.benchmarks]
        check(not stray, "grpo_on", f"{stray} are not among the benchmarks")
        families = [BENCHMARKS[b].family for b in self.grpo_on]
        check(len(set(families)) == len(families), "grpo_on", f"one benchmark per family, got {self.grpo_on}")
        check(self.maca.world.kind == "benchmark", "maca.world.kind", "the table runs benchmark worlds")
        check(bool(self.maca.baselines.systems), "maca.baselines.systems", "the table compares against baselines")
        for name in self.benchmarks:
            self.benchmark_config(name)  # every benchmark's config is valid before any work starts

    def trained_on(self, benchmark: str) -> str | None:
        """The benchmark whose trained policies `benchmark` runs (itself where GRPO trains on it), or None."""
        family = BENCHMARKS[benchmark].family
        return next((b for b in self.grpo_on if BENCHMARKS[b].family == family), None)

    def benchmark_config(self, benchmark: str) -> MacaConfig:
        m = self.maca
        source = self.trained_on(benchmark)
        grpo = m.grpo if source is not None else dataclasses.replace(m.grpo, iterations=0)
        return dataclasses.replace(
            m,
            run_dir=str(Path(self.run_dir, benchmark)),
            world=dataclasses.replace(m.world, benchmark=benchmark),
            pool_families=(BENCHMARKS[benchmark].family, "auxiliary"),
            policy_from="" if source in (None, benchmark) else str(Path(self.run_dir, source)),
            grpo=grpo,
        )

    def order(self) -> list[str]:
        """Benchmarks where GRPO trains first: the others run their policies."""
        return [b for b in self.benchmarks if b in self.grpo_on] + [b for b in self.benchmarks if b not in self.grpo_on]


def claim_table_dir(cfg: TableConfig) -> None:
    """Makes RUN_DIR the table's run (RUN_DIR/config.json; another config there is refused, naming the keys that
    differ). The baselines may change: they keep no state in the run directory (every rerun replays their calls
    from the exact response cache; MaAS and Puppeteer have no checkpoint, their training replays too), so a rerun
    with new baselines adds their rows (`run_table`)."""
    claim_run_dir(cfg.run_dir, cfg, may_change={"maca.baselines"})


def baselines_to_add(bcfg: MacaConfig, results: dict[str, Any]) -> list[str]:
    """The configured baselines a finished benchmark's results lack, in the configured order. Raises RunDirError
    where the results hold a MaAS or Puppeteer row trained under other settings (`baselines.maas` /
    `baselines.puppeteer`) than `bcfg`'s: read, not rerun, that row would not be the configured system."""
    held = {r["system"] for r in results.get("baselines", [])}
    recorded = results["config"].get("baselines", {})
    current = json.loads(json.dumps(to_dict(bcfg.baselines)))
    stale = [s for s in ADAPTIVE if s in held and recorded.get(s) != current[s]]  # each one's settings: its field
    if stale:
        raise RunDirError(
            f"{bcfg.run_dir}/results.json holds {stale} trained under other settings "
            f"({', '.join(f'{s}: {recorded.get(s)} -> {current[s]}' for s in stale)}): choose another run directory, "
            "or delete the benchmark's results.json to rerun it"
        )
    return [s for s in bcfg.baselines.systems if s not in held]


def chance(benchmark: str, tasks: list) -> float:
    """Expected accuracy of a uniform guess: 1 / options for multiple choice, 0 for a number or a program."""
    if BENCHMARKS[benchmark].family != "qa":
        return 0.0
    return float(np.mean([1.0 / t.data["n_options"] for t in tasks]))


def _answers(row: dict[str, Any], golds: list[str | None]) -> dict[str, Any]:
    """What the scorer found in the answers: the share with an answer at all, the commonest answer with its share,
    and (multiple choice) how often that answer is the gold one: what always giving it would score."""
    found = [v for v in row.get("extracted", []) if v is not None]
    if "extracted" not in row:
        return {}
    out: dict[str, Any] = {"answered": len(found) / len(row["extracted"]) if row["extracted"] else 0.0}
    if found and not isinstance(found[0], bool):
        top, count = Counter(map(str, found)).most_common(1)[0]
        out |= {"top_answer": top, "top_share": count / len(row["extracted"])}
        if any(golds):
            out["top_is_gold"] = sum(g == top for g in golds) / len(golds)
    return out


def _cell(row: dict[str, Any], golds: list[str | None]) -> dict[str, Any]:
    n, k = len(row["correct"]), int(sum(row["correct"]))
    lo, hi = wilson(k, n)
    out = {
        "system": row["system"],
        "correct": k,
        "n": n,
        "accuracy": k / n,
        "ci_low": lo,
        "ci_high": hi,
        "tokens_per_task": row["avg_cost"],
        "calls_per_task": row["avg_calls"],
    }
    if "invalid_action_rate" in row:
        out["invalid_action_rate"] = row["invalid_action_rate"]
    if "policy" in row:
        out["policy"] = row["policy"]
    return out | _answers(row, golds)


def benchmark_rows(cfg: TableConfig, benchmark: str, results: dict[str, Any]) -> dict[str, Any]:
    """One benchmark's cells (systems, then the configured baselines in their order) with its metric and chance
    level."""
    bcfg = cfg.benchmark_config(benchmark)
    tasks = load_tasks(benchmark, "test", subset=bcfg.world.subset)[: bcfg.world.num_eval]
    golds = [t.data.get("answer") if t.family == "qa" else None for t in tasks]
    held = {r["system"]: r for r in results["baselines"]}
    cells = [_cell(r, golds) for r in results["systems"]] + [
        _cell(held[s], golds) for s in bcfg.baselines.systems if s in held
    ]
    level = chance(benchmark, tasks)
    for c in cells:
        c["at_chance"] = c["ci_low"] <= level <= c["ci_high"] if level > 0 else c["correct"] == 0
    return {
        "benchmark": benchmark,
        "metric": BENCHMARKS[benchmark].metric,
        "chance": level,
        "tasks": len(tasks),
        "trained_on": cfg.trained_on(benchmark),
        "cells": cells,
        "seconds": results["timings"]["total_s"],
        "prior": {k: v for k, v in results["prior"].items() if isinstance(v, (int, float, str))},
    }


def run_table(
    cfg: TableConfig, backend: Backend, log: Callable[[str], None] = print, *, cache_stats: Callable[[], dict] = dict
) -> dict[str, Any]:
    """Every benchmark in `cfg.order()` through `backend` (the caller's cached backend); returns what table.json
    holds. A benchmark whose results.json exists is read, not rerun, but for the configured baselines it lacks:
    those run and are added to it (`baselines_to_add`, `experiment.add_baselines`). Where the backend keeps the
    response cache's scopes, each benchmark's log line says which scopes (baselines; "unscoped": everything else)
    reached the model and with how many calls."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    out: dict[str, Any] = {"config": to_dict(cfg), "benchmarks": {}}
    stages = Stages(log)
    for benchmark in cfg.order():
        bcfg = cfg.benchmark_config(benchmark)
        done = Path(bcfg.run_dir, "results.json")
        t0, before, reached = time.perf_counter(), scope_counts(backend), ""
        if stages.should_run(f"[table] {benchmark} (results in {done})", done=done.exists()):
            log(f"[table] {benchmark}: policy {cfg.trained_on(benchmark) or 'untrained'}; cache {cache_stats()}")
            from porch_jax.maca import experiment  # JAX: loaded when a benchmark runs, not when its config is read

            results = experiment.run(bcfg, backend=backend, log=lambda line, b=benchmark: log(f"[{b}] {line}"))
        else:
            results = json.loads(done.read_text())
            names = baselines_to_add(bcfg, results)
            if names:
                log(f"[table] {benchmark}: adding baselines {names}; the others are read from {done}")
                from porch_jax.maca import experiment

                results = experiment.add_baselines(
                    bcfg, names, backend=backend, log=lambda line, b=benchmark: log(f"[{b}] {line}")
                )
                calls = None if before is None else counts_since(before, scope_counts(backend))
                out.setdefault("added_baselines", {})[benchmark] = added(names, time.perf_counter() - t0, calls)
                log(f"[table] {benchmark}: {added_line(out['added_baselines'][benchmark])}")
        out["benchmarks"][benchmark] = benchmark_rows(cfg, benchmark, results)
        if before is not None:
            reached = f"; model calls {model_calls(counts_since(before, scope_counts(backend))) or 'none'}"
        log(f"[table] {benchmark} in {time.perf_counter() - t0:.0f} s{reached}; cache {cache_stats()}")
        _write(run_dir, out | {"cache": cache_stats(), "seconds_this_call": time.perf_counter() - start})
    if "added_baselines" in out:
        seconds = sum(a["seconds"] for a in out["added_baselines"].values())
        log(f"[table] the added baselines took {seconds:.0f} s in all, setup included")
    out |= {"cache": cache_stats(), "seconds_this_call": time.perf_counter() - start}
    _write(run_dir, out)
    return out


def model_calls(calls: dict[str | None, CacheStats]) -> dict[str, int]:
    """Calls that reached the model per response-cache scope ("unscoped": outside any), the scopes with any."""
    return {"unscoped" if k is None else k: v.model_calls for k, v in calls.items() if v.model_calls}


def added(names: list[str], seconds: float, calls: dict[str | None, CacheStats] | None) -> dict[str, Any]:
    """What adding baselines `names` to a finished benchmark took: seconds (their setup included) and, where the
    backend keeps scopes, the model calls of their scopes (their runs and MaAS / Puppeteer's training) and of
    everything else (the existing systems, which are not rerun, and the setup, which restores its prior: 0 calls
    where the run directory holds it)."""
    out: dict[str, Any] = {"systems": names, "seconds": seconds}
    if calls is not None:
        ours = {*names, *(training_scope(n) for n in names)}
        out["model_calls"] = {n: c.model_calls for n, c in calls.items() if n in ours}
        out["other_model_calls"] = sum(c.model_calls for n, c in calls.items() if n not in ours)
    return out


def added_line(a: dict[str, Any]) -> str:
    """The log line of an `added` record."""
    line = f"added {', '.join(a['systems'])} in {a['seconds']:.1f} s"
    if "model_calls" in a:
        line += (
            f"; model calls {a['model_calls'] or 'none'}; existing systems and setup: {a['other_model_calls']} calls"
        )
    return line


def _write(run_dir: Path, out: dict[str, Any]) -> None:
    from porch_jax.maca import analysis

    analysis.write_json(run_dir / "table.json", out)
    (run_dir / "table.md").write_text(markdown(out))
    plot(out, run_dir / "table.png")


def _fmt(c: dict[str, Any]) -> str:
    mark = "*" if c["at_chance"] else ""
    return f"{c['accuracy']:.3f}{mark} [{c['ci_low']:.2f}, {c['ci_high']:.2f}] · {c['tokens_per_task']:,.0f}"


def markdown(out: dict[str, Any]) -> str:
    """The wide table (systems x benchmarks) and the long one (every cell with its counts)."""
    benches = [b for b in BENCHMARK_ORDER if b in out["benchmarks"]] + [
        b for b in out["benchmarks"] if b not in BENCHMARK_ORDER
    ]
    data = out["benchmarks"]
    systems = list(dict.fromkeys(c["system"] for b in benches for c in data[b]["cells"]))
    lines = [
        "# MACA with real agents",
        "",
        "Accuracy (pass@1 for code) on each benchmark's recorded 30-task test subset, Wilson 95% interval, and tokens "
        "per task (prompt + completion over every agent call). `*`: the interval holds the chance level (a uniform "
        "guess over the options; 0 for numbers and programs, where `*` marks no task solved).",
        "",
        "| system | " + " | ".join(benches) + " |",
        "|---|" + "---|" * len(benches),
    ]
    for s in systems:
        cells = []
        for b in benches:
            c = next((c for c in data[b]["cells"] if c["system"] == s), None)
            cells.append("" if c is None else _fmt(c))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("| chance | " + " | ".join(f"{data[b]['chance']:.3f}" for b in benches) + " |")
    lines.append(
        "| pi_theta trained on | "
        + " | ".join(str(data[b]["trained_on"] or "none (untrained)") for b in benches)
        + " |"
    )
    lines += ["", "## Every cell", ""]
    lines += [
        "| benchmark | system | correct / n | accuracy | 95% CI | tokens / task | calls / task | invalid actions | "
        "policy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in benches:
        for c in data[b]["cells"]:
            invalid = f"{c['invalid_action_rate']:.3f}" if "invalid_action_rate" in c else ""
            lines.append(
                f"| {b} | {c['system']} | {c['correct']} / {c['n']} | {c['accuracy']:.3f} | "
                f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] | {c['tokens_per_task']:,.0f} | {c['calls_per_task']:.2f} | "
                f"{invalid} | {c.get('policy', '')} |"
            )
    lines += [
        "",
        "## What the scorer found in the answers",
        "",
        "answered: the share of tasks whose final answer holds what the scorer reads (a number, an option letter, a "
        "program); the commonest answer with its share; for multiple choice, how often that letter is the gold one "
        "(what always answering it would score).",
        "",
        "| benchmark | system | answered | commonest answer (share) | always it: accuracy |",
        "|---|---|---|---|---|",
    ]
    for b in benches:
        for c in data[b]["cells"]:
            if "answered" not in c:
                continue
            top = f"{c['top_answer']} ({c['top_share']:.2f})" if "top_answer" in c else ""
            gold = f"{c['top_is_gold']:.3f}" if "top_is_gold" in c else ""
            lines.append(f"| {b} | {c['system']} | {c['answered']:.2f} | {top} | {gold} |")
    seconds = {b: round(data[b]["seconds"]) for b in benches}
    lines += ["", f"Seconds per benchmark (its own run): {json.dumps(seconds)}", f"Cache: {json.dumps(out['cache'])}"]
    lines += [f"Baselines added on {b}: {added_line(a)}" for b, a in out.get("added_baselines", {}).items()]
    return "\n".join(lines) + "\n"


def plot(out: dict[str, Any], path: Path) -> None:
    """Accuracy with its interval per system, one panel per benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = [b for b in BENCHMARK_ORDER if b in out["benchmarks"]]
    if not benches:
        return
    fig, axes = plt.subplots(1, len(benches), figsize=(3.2 * len(benches), 4.2), sharey=True, squeeze=False)
    for ax, b in zip(axes[0], benches, strict=True):
        cells = out["benchmarks"][b]["cells"]
        acc = np.array([c["accuracy"] for c in cells])
        err = np.array([[c["accuracy"] - c["ci_low"] for c in cells], [c["ci_high"] - c["accuracy"] for c in cells]])
        ax.bar(range(len(cells)), acc, yerr=err, capsize=2, color=["C0" if c.get("policy") else "C1" for c in cells])
        ax.axhline(out["benchmarks"][b]["chance"], color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(cells)), [c["system"] for c in cells], rotation=90, fontsize=7)
        ax.set_title(b, fontsize=9)
    axes[0][0].set_ylabel("accuracy / pass@1 (95% CI); dashed: chance")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
