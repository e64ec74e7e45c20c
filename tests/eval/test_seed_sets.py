"""Seed sets as the reported unit: each set's config, and the aggregation of the sets' results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import quickstart
from porch_jax.eval import plots, report, seed_sets
from porch_jax.opod.config import ExperimentConfig, with_seed_set
from porch_jax.typed_config import ConfigError, diff, from_dict, to_dict
from tests.eval.outcomes import records_with

T_975_DF2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom (tables)


def _seeds(node, path=""):
    """Every seed a seed set shifts, by dotted key; the policy server's own seed stays (requests carry theirs)."""
    out = {}
    for key, value in to_dict(node).items():
        if path + key == "serving":
            continue
        if isinstance(value, dict):
            out.update(_seeds(value, f"{path}{key}."))
        elif key == "seed" and value is not None:  # None: an unseeded draw (the GRM's greedy sampling)
            out[path + key] = value
    return out


def test_a_seed_set_shifts_every_seed_and_keeps_the_compared_tasks():
    cfg = from_dict(ExperimentConfig, quickstart.get_config())
    base = _seeds(cfg)
    seeds = {"seed", "model.seed", "sft.seed", "rwr.seed", "opod.opd.sampling.seed", "dagrpo.group.sampling.seed"}
    assert seeds <= set(base)
    zero = with_seed_set(cfg, 0)
    assert _seeds(zero) == base and zero.rollouts.seed_start == cfg.rollouts.seed_start
    assert zero.run_dir == "runs/quickstart/seed_set_0"
    two = with_seed_set(cfg, 2)
    assert _seeds(two) == {k: v + 20 for k, v in base.items()}
    assert two.rollouts.seed_start == cfg.rollouts.seed_start + 2000
    for section in ("expert_rollouts", "selection", "suite"):  # the tasks every set is compared on
        assert getattr(two, section) == getattr(cfg, section)
    assert two.eval.tasks == cfg.eval.tasks and two.seed_sets == ()
    assert cfg.sft.seed == 1  # the input config is left as it was
    with pytest.raises(ValueError, match=r"50000-50299 overlap selection.tasks \(50000-50099\)"):
        with_seed_set(cfg, 30)


def test_the_quickstart_argument_writes_each_seed_set_and_no_argument_the_quickstart_as_written():
    typed = lambda arg=None: from_dict(ExperimentConfig, quickstart.get_config(arg))  # noqa: E731
    default = typed()
    assert default.run_dir == "runs/quickstart" and default.seed_sets == () and default.sft.seed == 1
    sets = typed("seed_sets=8")
    assert sets.run_dir == "runs/quickstart_seeds" and sets.seed_sets == tuple(range(8))
    for k in (0, 3):  # `:seed_set=k` is set k of the `:seed_sets=N` run, in the same folder
        assert typed(f"seed_set={k}") == with_seed_set(sets, k)
        assert diff(typed(f"seed_set={k}"), default) == (
            ["run_dir"] if k == 0 else sorted(["run_dir", "rollouts.seed_start", *_seeds(default)])
        )
    with pytest.raises(ConfigError, match="not both"):
        quickstart.get_config("seed_set=1,seed_sets=2")
    with pytest.raises(ConfigError, match=r"seed_sst: unknown key \(did you mean seed_set\?\)"):
        quickstart.get_config("seed_sst=1")


def _results(tmp_path, k, sft, rwr, opod):
    records = {"sft": records_with(sft), "rwr": records_with(rwr), "opod": records_with(opod)}
    path = tmp_path / f"r{k}.json"
    report.write_results(
        report.summaries(records, reference="sft"),
        [report.compare(records, "opod", "rwr"), report.compare(records, "rwr", "sft")],
        path,
    )
    return json.loads(path.read_text())


def test_sets_aggregate_to_means_and_t_intervals_over_sets(tmp_path):
    n = 100
    # set 0: RWR loses 10 of SFT's successes and wins 15 others (net +0.05, a wide paired interval)
    sets = {
        0: ([1] * 70 + [0] * 30, [0] * 10 + [1] * 75 + [0] * 15, [1] * 95 + [0] * 5),
        1: ([1] * 76 + [0] * 24, [1] * 93 + [0] * 7, [1] * 94 + [0] * 6),
        4: ([1] * 71 + [0] * 29, [1] * 90 + [0] * 10, [1] * 93 + [0] * 7),
    }
    agg = seed_sets.aggregate({k: _results(tmp_path, k, *v) for k, v in sets.items()})
    assert agg["seed_sets"] == [0, 1, 4]
    opod = next(m for m in agg["methods"] if m["system"] == "opod")
    values = np.array([0.95, 0.94, 0.93])
    assert opod["success"] == pytest.approx(list(values))
    assert opod["mean"] == pytest.approx(values.mean()) and opod["sd"] == pytest.approx(values.std(ddof=1))
    half = T_975_DF2 * values.std(ddof=1) / np.sqrt(3)
    assert opod["ci"] == pytest.approx([values.mean() - half, values.mean() + half])
    rwr_sft = next(c for c in agg["comparisons"] if (c["better"], c["worse"]) == ("rwr", "sft"))
    deltas = np.array([75, 93, 90]) / n - np.array([70, 76, 71]) / n
    assert rwr_sft["delta"] == pytest.approx(list(deltas)) and rwr_sft["mean"] == pytest.approx(deltas.mean())
    # set 0's own paired interval (+0.05 on 100 tasks) includes zero; sets 1 and 4 lie above it
    assert rwr_sft["sets_above_zero"] == 2
    table = seed_sets.format_table(agg)
    assert (
        "| opod | 0.940 | 0.010 |" in table and f"| rwr - sft | {deltas.mean():+.3f} |" in table and "| 2/3 |" in table
    )
    assert plots.plot_seed_sets(agg, tmp_path / "s.png").stat().st_size > 1000


def test_intervals_stay_within_the_possible_range(tmp_path):
    # OPOD at 1.0, 1.0, 0.9: the t-interval of the mean runs to 0.967 + 0.143 > 1, and is clipped there
    sets = {
        k: ([1] * 6 + [0] * 4, [1] * 8 + [0] * 2, opod) for k, opod in enumerate(([1] * 10, [1] * 10, [1] * 9 + [0]))
    }
    agg = seed_sets.aggregate({k: _results(tmp_path, k, *v) for k, v in sets.items()})
    opod = next(m for m in agg["methods"] if m["system"] == "opod")
    half = T_975_DF2 * np.std([1, 1, 0.9], ddof=1) / np.sqrt(3)
    assert opod["mean"] + half > 1.05 and opod["ci"] == pytest.approx([opod["mean"] - half, 1.0])
    sft = next(m for m in agg["methods"] if m["system"] == "sft")
    assert sft["sd"] == 0 and sft["ci"] == pytest.approx([0.6, 0.6])  # zero spread: the interval is the point
    for c in agg["comparisons"]:
        assert -1 <= c["ci"][0] <= c["mean"] <= c["ci"][1] <= 1
    assert "| opod | 0.967 | 0.058 | [0.823, 1.000] |" in seed_sets.format_table(agg)


def test_a_method_missing_from_a_set_is_left_out_and_named(tmp_path):
    one = _results(tmp_path, 0, [1, 0, 1], [1, 1, 1], [1, 1, 0])
    other = _results(tmp_path, 1, [1, 0, 0], [1, 1, 0], [1, 1, 1])
    other["methods"] = [m for m in other["methods"] if m["system"] != "rwr"]  # set 1 could not train RWR
    other["comparisons"] = [c for c in other["comparisons"] if "rwr" not in (c["better"], c["worse"])]
    agg = seed_sets.aggregate({0: one, 1: other})
    assert [m["system"] for m in agg["methods"]] == ["sft", "opod"] and agg["partial"] == {"rwr": [0]}
    assert agg["comparisons"] == []  # both pairs involve RWR
    table = seed_sets.format_table(agg)
    assert "rwr: trained in seed sets [0] only" in table and "Paired differences" not in table
    with pytest.raises(ValueError, match="no seed-set results"):
        seed_sets.aggregate({})
