"""MACA's real-agent table (porch_jax/maca/table.py, experiments/maca_real_agents.py) with a scripted model in place
of the served one: which benchmark trains, which runs a family's policy and which none; per-cell counts, intervals
and chance levels; the whole table resumed from its results and its response cache; a baseline added to the
finished table runs alone, while any other change is refused."""

from __future__ import annotations

import json

import pytest

from porch_jax.typed_config import ConfigError, RunDirError, from_dict

pytestmark = pytest.mark.slow  # three small MACA experiments end to end (about a minute)


def _tasks(names):
    from porch_jax.envs.benchmarks import load_tasks

    try:
        return {n: load_tasks(n, "train", subset=True) + load_tasks(n, "test", subset=True) for n in names}
    except (FileNotFoundError, OSError, ImportError) as e:
        pytest.skip(f"benchmark data is not available: {e}")


class Model:
    """MathSolver and CodeWriting answer right; every other agent restates the task; routers pick MathSolver or
    CodeWriting once, then STOP; the single-model systems (ComplexCoT's few-shot prompt too) answer right."""

    def __init__(self, tasks):
        from porch_jax.envs.benchmarks.answers import format_number

        self.calls = 0
        self.answers = {}
        for t in (t for ts in tasks.values() for t in ts):
            if t.family == "math":
                self.answers[t.prompt] = f"The answer is {format_number(t.data['target'])}."
            else:
                self.answers[t.prompt] = f"```python\n{t.data['prompt']}{t.reference}```"

    def __call__(self, request):
        from porch_jax.maca.baselines import COT_SUFFIX

        self.calls += 1
        text = request.messages[-1]["content"]
        if request.role == "router":
            for name in ("MathSolver", "CodeWriting"):
                if f"- {name}:" in text and f"[{name}]" not in text:
                    return name
            return "STOP"
        if request.role == "critic":
            return "NO ISSUES"
        task = text.split("\n\nWork so far:")[0].removesuffix(COT_SUFFIX)
        if task not in self.answers:  # ComplexCoT: worked examples, then the held-out question
            task = next(p for p in self.answers if task.endswith(f"Question: {p}\nAnswer: {COT_SUFFIX.strip()}"))
        if request.role == "solver" or any(n in request.messages[0]["content"] for n in ("MathSolver", "CodeWrit")):
            return self.answers[task]
        return "Restating: " + task[:40]


def _cached(model, path):
    from porch_jax.backends import ScriptedBackend
    from porch_jax.backends.cache import CachedBackend

    return CachedBackend(ScriptedBackend(model), path, model_id="scripted@1")


def _config(run_dir, names, baselines=("vanilla", "router_mask"), grpo_iterations=1):
    from experiments.maca_real_agents import smoke_config
    from porch_jax.maca.table import TableConfig

    c = smoke_config(str(run_dir), names)
    c.maca.baselines.systems = baselines
    c.maca.grpo.iterations = grpo_iterations
    return from_dict(TableConfig, c)


def test_the_table_trains_transfers_resumes_from_its_results_and_cache_and_adds_baselines(tmp_path):
    from porch_jax.maca.table import claim_table_dir, run_table

    names = ("gsm_hard", "svamp", "humaneval")
    cfg = _config(tmp_path / "table", names)
    claim_table_dir(cfg)  # as launch/maca_table.py does
    assert cfg.order() == ["gsm_hard", "svamp", "humaneval"]
    assert [cfg.trained_on(b) for b in names] == ["gsm_hard", "gsm_hard", None]
    assert cfg.benchmark_config("svamp").policy_from == str(tmp_path / "table" / "gsm_hard")
    assert cfg.benchmark_config("humaneval").grpo.iterations == 0
    assert cfg.benchmark_config("humaneval").pool_families == ("code", "auxiliary")
    model = Model(_tasks(names))
    backend = _cached(model, tmp_path / "table" / "responses.jsonl")
    out = run_table(cfg, backend, log=lambda s: None, cache_stats=backend.stats.to_dict)
    backend.close()

    assert list(out["benchmarks"]) == list(names)
    for b in names:
        cells = {c["system"]: c for c in out["benchmarks"][b]["cells"]}
        assert list(cells) == [
            "maca",
            "no_z_prior",
            "no_p_prior",
            "no_graphspec",
            "no_policy",
            "vanilla",
            "router_mask",
        ]
        assert all(c["n"] == 2 and 0 <= c["ci_low"] <= c["accuracy"] <= c["ci_high"] <= 1 for c in cells.values())
        assert cells["vanilla"]["accuracy"] == 1.0 and cells["vanilla"]["calls_per_task"] == 1
        assert cells["router_mask"]["invalid_action_rate"] == 0.0
        assert out["benchmarks"][b]["chance"] == 0.0 and out["benchmarks"][b]["tasks"] == 2
        assert cells["vanilla"]["answered"] == 1.0 and cells["router_mask"]["answered"] >= 0.0
    policy = {b: out["benchmarks"][b]["cells"][0]["policy"] for b in names}
    assert policy["gsm_hard"].startswith("trained here") and policy["humaneval"] == "untrained"
    assert policy["svamp"] == f"trained in {tmp_path / 'table' / 'gsm_hard'}"
    table = (tmp_path / "table" / "table.md").read_text()
    assert "| pi_theta trained on | gsm_hard | humaneval" not in table and "none (untrained)" in table
    assert (tmp_path / "table" / "table.png").stat().st_size > 0
    assert out["cache"]["misses"] == model.calls > 0
    gsm = {c["system"]: c for c in out["benchmarks"]["gsm_hard"]["cells"]}
    assert gsm["vanilla"]["top_share"] == 0.5 and "top_is_gold" not in gsm["vanilla"]  # two tasks, two numbers
    assert "## What the scorer found in the answers" in table

    # a rerun reads every finished benchmark; one whose results are gone is replayed from the cache alone
    (tmp_path / "table" / "svamp" / "results.json").unlink()
    model2 = Model(_tasks(names))
    again_backend = _cached(model2, tmp_path / "table" / "responses.jsonl")
    again = run_table(cfg, again_backend, log=lambda s: None, cache_stats=again_backend.stats.to_dict)
    again_backend.close()
    assert model2.calls == 0 and again["cache"]["hits"] > 0
    strip = {"seconds"}
    for b in names:
        first = [{k: v for k, v in c.items() if k not in strip} for c in out["benchmarks"][b]["cells"]]
        second = [{k: v for k, v in c.items() if k not in strip} for c in again["benchmarks"][b]["cells"]]
        assert first == second, b
    assert json.loads((tmp_path / "table" / "table.json").read_text())["benchmarks"]["svamp"]["cells"]

    # a baseline added to the finished table: the config is accepted, each benchmark runs only it, adds its row to
    # results.json (the rows there kept as they were) and the table gains it; no other system reaches the model
    before = {b: json.loads((tmp_path / "table" / b / "results.json").read_text()) for b in names}
    grown_cfg = _config(tmp_path / "table", names, ("vanilla", "complex_cot", "router_mask"))
    claim_table_dir(grown_cfg)
    model3, lines = Model(_tasks(names)), []
    grown_backend = _cached(model3, tmp_path / "table" / "responses.jsonl")
    grown = run_table(grown_cfg, grown_backend, log=lines.append, cache_stats=grown_backend.stats.to_dict)
    grown_backend.close()
    assert set(grown_backend.scoped) == {"complex_cot"}  # the setups restore their priors: no call outside it
    assert model3.calls == grown_backend.scoped["complex_cot"].misses == 6  # one call per task, 2 tasks x 3
    for b in names:
        results = json.loads((tmp_path / "table" / b / "results.json").read_text())
        assert results["baselines"][:2] == before[b]["baselines"]
        assert [r["system"] for r in results["baselines"]] == ["vanilla", "router_mask", "complex_cot"]
        assert results["baselines"][2]["cache"] == {"hits": 0, "misses": 2, "uncacheable": 0, "shared": 0}
        assert results["systems"] == before[b]["systems"]
        assert results["config"]["baselines"]["systems"] == ["vanilla", "router_mask", "complex_cot"]
        assert results["timings"]["total_s"] > before[b]["timings"]["total_s"]
        cells = [{k: v for k, v in c.items() if k not in strip} for c in grown["benchmarks"][b]["cells"]]
        kept = [{k: v for k, v in c.items() if k not in strip} for c in again["benchmarks"][b]["cells"]]
        assert [c["system"] for c in cells] == [*[c["system"] for c in kept[:-1]], "complex_cot", "router_mask"]
        assert [c for c in cells if c["system"] != "complex_cot"] == kept
        assert cells[-2]["accuracy"] == 1.0 and cells[-2]["calls_per_task"] == 1
        added = grown["added_baselines"][b]
        assert added["model_calls"] == {"complex_cot": 2} and added["other_model_calls"] == 0
        assert f"[table] {b}: added complex_cot in {added['seconds']:.1f} s" in "\n".join(lines)
    assert sum("existing systems and setup: 0 calls" in line for line in lines) == len(names)
    # the evaluation's progress line: at most every 30 s and at its last episode, with rate and ETA
    assert sum(f"[{b}] baselines: 2/2 episodes | " in line for b in names for line in lines) == len(names), lines
    assert "| complex_cot |" in (tmp_path / "table" / "table.md").read_text()

    # anything else changed is refused: by the table's record, and by each benchmark's own when one would run
    changed = _config(tmp_path / "table", names, ("vanilla", "complex_cot", "router_mask", "cot"), grpo_iterations=2)
    with pytest.raises(RunDirError, match=r"maca\.grpo\.iterations: 1 -> 2"):
        claim_table_dir(changed)
    refused_backend = _cached(Model(_tasks(names)), tmp_path / "table" / "responses.jsonl")
    with pytest.raises(RunDirError, match=r"grpo\.iterations: 1 -> 2"):
        run_table(changed, refused_backend, log=lambda s: None)
    refused_backend.close()
    assert refused_backend.stats == type(refused_backend.stats)()


def test_a_finished_benchmark_adds_the_baselines_it_lacks_but_keeps_no_adaptive_row_trained_otherwise(tmp_path):
    import dataclasses

    from porch_jax.maca.table import baselines_to_add
    from porch_jax.typed_config import to_dict

    bcfg = _config(tmp_path, ("gsm_hard",), ("vanilla", "maas", "complex_cot")).benchmark_config("gsm_hard")
    results = {
        "config": json.loads(json.dumps(to_dict(bcfg))),
        "baselines": [{"system": "maas"}, {"system": "vanilla"}],
    }
    assert baselines_to_add(bcfg, results) == ["complex_cot"]
    maas = dataclasses.replace(bcfg.baselines.maas, iterations=bcfg.baselines.maas.iterations + 1)
    other = dataclasses.replace(bcfg, baselines=dataclasses.replace(bcfg.baselines, maas=maas))
    with pytest.raises(RunDirError, match=r"\['maas'\] trained under other settings"):
        baselines_to_add(other, results)
    no_maas = results | {"baselines": [{"system": "vanilla"}]}
    assert baselines_to_add(other, no_maas) == ["maas", "complex_cot"]  # no row of it yet: nothing to contradict


def test_the_table_config_is_checked_before_any_work():
    from experiments.maca_real_agents import get_config
    from porch_jax.maca.table import TableConfig

    c = get_config()
    cfg = from_dict(TableConfig, c)
    assert cfg.maca.world.num_eval == 30 and cfg.maca.backend.sampling.max_tokens == 128 and len(cfg.benchmarks) == 6
    c.grpo_on = ("gsm_hard", "svamp")
    with pytest.raises(ConfigError, match="one benchmark per family"):
        from_dict(TableConfig, c)
    c.grpo_on = ("gsm_hard", "arc_challenge", "humaneval")
    with pytest.raises(ConfigError, match="at most two"):
        from_dict(TableConfig, c)
    c.grpo_on = ("gsm_hard",)
    c.maca.baselines.systems = ("vanilla", "debate")
    with pytest.raises(ConfigError, match="debate"):
        from_dict(TableConfig, c)


def test_what_the_scorer_found_counts_answers_and_what_always_giving_the_commonest_would_score():
    from porch_jax.maca.table import _answers

    got = _answers({"extracted": ["A", "A", "B", None]}, ["A", "B", "A", "C"])
    assert got == {"answered": 0.75, "top_answer": "A", "top_share": 0.5, "top_is_gold": 0.5}
    assert _answers({"extracted": [True, None]}, [None, None]) == {"answered": 0.5}  # code: a program or not
    assert _answers({"correct": [True]}, [None]) == {}  # results from before the field: nothing to say
