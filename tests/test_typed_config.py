"""porch_jax.typed_config: ConfigDict -> frozen dataclasses, errors naming the dotted key, absl integration."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from typing import Any, Literal, Optional

import pytest
from absl import flags
from ml_collections import ConfigDict

from porch_jax.typed_config import (
    ConfigError,
    RunDirError,
    changes,
    check,
    claim_run_dir,
    define_config_flag,
    diff,
    from_dict,
    parse_arg,
    resumable,
    resumable_keys,
    to_dict,
)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    learning_rate: float = 1e-3
    schedule: Literal["constant", "cosine"] = "constant"
    warmup: int = 0

    def __post_init__(self):
        check(self.learning_rate > 0, "learning_rate", "must be > 0")


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    seeds: tuple[int, ...] = (0,)
    mesh: tuple[int, int, int] = (1, 1, 1)
    optimizer: Optimizer = Optimizer()
    widths: dict[str, int] = dataclasses.field(default_factory=dict)
    data_dir: Optional[str] = None  # noqa: UP045 - typing.Optional is converted as X | None is
    tag: str | int | None = None
    extra: Any = None
    debug: bool = False


def test_builds_nested_with_defaults_and_coercion():
    cfg = ConfigDict({"name": "x", "seeds": [1, 2], "optimizer": {"learning_rate": 1, "schedule": "cosine"}})
    exp = from_dict(Experiment, cfg)
    assert exp == Experiment(name="x", seeds=(1, 2), optimizer=Optimizer(learning_rate=1.0, schedule="cosine"))
    assert isinstance(exp.optimizer.learning_rate, float)  # int -> float
    assert isinstance(exp.seeds, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.name = "y"  # type: ignore[misc]


def test_unknown_key_names_dotted_path_with_suggestion():
    with pytest.raises(ConfigError) as e:
        from_dict(Experiment, {"name": "x", "optimizer": {"lerning_rate": 0.1}})
    message = str(e.value)
    assert message.startswith("config.optimizer.lerning_rate: unknown key (did you mean learning_rate?)")
    assert "known: learning_rate, schedule, warmup" in message


@pytest.mark.parametrize(
    "data, key, fragment",
    [
        ({"name": "x", "optimizer": {"warmup": "3"}}, "config.optimizer.warmup", "expected an int"),  # str -> int not
        ({"name": "x", "optimizer": {"warmup": 2.5}}, "config.optimizer.warmup", "expected an int"),
        ({"name": "x", "debug": 1}, "config.debug", "expected a bool"),
        ({"name": 3}, "config.name", "expected a str"),
        ({"name": "x", "optimizer": {"schedule": "linear"}}, "config.optimizer.schedule", "not one of"),
        ({"name": "x", "optimizer": {"learning_rate": -1.0}}, "config.optimizer.learning_rate", "must be > 0"),
        ({"name": "x", "mesh": (1, 2)}, "config.mesh", "expected 3 values"),
        ({"name": "x", "seeds": ("a",)}, "config.seeds[0]", "expected an int"),
        ({"name": "x", "widths": {"a": "b"}}, "config.widths.a", "expected an int"),
        ({"name": "x", "optimizer": 3}, "config.optimizer", "expected a mapping"),
        ({}, "config.name", "missing required key"),
    ],
)
def test_bad_values_name_the_key(data, key, fragment):
    with pytest.raises(ConfigError) as e:
        from_dict(Experiment, data)
    assert str(e.value).startswith(key + ":"), str(e.value)
    assert fragment in str(e.value)


def test_optional_and_any():
    exp = from_dict(Experiment, {"name": "x", "data_dir": None, "extra": ConfigDict({"a": (1, 2)})})
    assert exp.data_dir is None and exp.extra == {"a": (1, 2)}
    assert from_dict(Experiment, {"name": "x", "data_dir": "/d"}).data_dir == "/d"
    assert from_dict(Experiment, {"name": "x", "tag": 3}).tag == 3
    with pytest.raises(ConfigError, match=r"config.tag: 2.5 fits none of str, int, NoneType"):
        from_dict(Experiment, {"name": "x", "tag": 2.5})


def test_to_dict_round_trips_through_json():
    exp = Experiment(name="x", seeds=(1, 2), widths={"a": 3}, optimizer=Optimizer(0.5, "cosine", 2))
    plain = json.loads(json.dumps(to_dict(exp)))
    assert plain["seeds"] == [1, 2] and plain["optimizer"]["schedule"] == "cosine"
    assert from_dict(Experiment, plain) == exp


def test_diff_names_changed_keys():
    a = Experiment(name="x")
    b = dataclasses.replace(a, optimizer=Optimizer(learning_rate=0.5), seeds=(0, 1))
    assert diff(a, b) == ["optimizer.learning_rate", "seeds"]
    assert diff(a, a) == []
    assert diff({"a": 1}, {"b": 1}) == ["a", "b"]


def test_parse_arg():
    assert vars(parse_arg(None, seed_set=0, fast=False)) == {"seed_set": 0, "fast": False}
    assert vars(parse_arg("seed_set=3,fast", seed_set=0, fast=False)) == {"seed_set": 3, "fast": True}
    assert parse_arg("humaneval", benchmark="gsm_hard", seed=0).benchmark == "humaneval"
    assert parse_arg("humaneval,seed=2", benchmark="gsm_hard", seed=0).seed == 2
    assert parse_arg("lr=0.5", lr=1.0).lr == 0.5
    with pytest.raises(ConfigError, match=r"seed_sets: unknown key \(did you mean seed_set\?\)"):
        parse_arg("seed_sets=3", seed_set=0)
    with pytest.raises(ConfigError, match="seed_set: expected an int"):
        parse_arg("seed_set=three", seed_set=0)
    with pytest.raises(ConfigError, match="fast: expected a bool"):
        parse_arg("fast=maybe", fast=False)


def test_config_error_is_an_absl_flags_error():
    # absl's app.run prints a flags.Error raised during parsing as one line and exits 1
    assert issubclass(ConfigError, flags.Error)


_LAUNCHER = textwrap.dedent(
    """
    import dataclasses
    from typing import Literal
    from absl import app
    from porch_jax.typed_config import check, define_config_flag

    @dataclasses.dataclass(frozen=True)
    class Inner:
        lr: float = 1.0
        kind: Literal["a", "b"] = "a"

        def __post_init__(self):
            check(self.lr > 0, "lr", "must be > 0")

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        seed: int = 0
        inner: Inner = Inner()

    CONFIG = define_config_flag("config", Cfg, "config file", required=True)

    def main(argv):
        print("VALUE", CONFIG.value)

    if __name__ == "__main__":
        app.run(main)
    """
)
_CONFIG_FILE = textwrap.dedent(
    """
    from ml_collections import ConfigDict
    from porch_jax.typed_config import parse_arg

    def get_config(arg=None):
        a = parse_arg(arg, seed=0)
        return ConfigDict({"seed": a.seed, "inner": {"lr": 2.0, "kind": "a"}})
    """
)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    folder = tmp_path_factory.mktemp("launcher")
    (folder / "launcher.py").write_text(_LAUNCHER)
    (folder / "cfg.py").write_text(_CONFIG_FILE)

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(folder / "launcher.py"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    return run, folder / "cfg.py"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config.nonexistent_key=3"], "config.nonexistent_key: unknown key"),
        (["--config.nonexistent.deep=3"], "config.nonexistent: unknown key"),
        (["--config.inner.lerning=3"], "config.inner.lerning: unknown key"),
        (["--config.inner.lr=-1"], "config.inner.lr: must be > 0"),
        (["--config.inner.kind=c"], "config.inner.kind: 'c' is not one of 'a', 'b'"),
        ([":sed=3"], "config argument sed: unknown key (did you mean seed?)"),
    ],
)
def test_absl_entry_point_reports_one_line(launcher, args, message):
    run, cfg = launcher
    if args[0].startswith(":"):
        args = [f"--config={cfg}{args[0]}"]
    else:
        args = [f"--config={cfg}", *args]
    result = run(*args)
    assert result.returncode == 1
    assert f"FATAL Flags parsing error: {message}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_absl_entry_point_applies_overrides_and_args(launcher):
    run, cfg = launcher
    result = run(f"--config={cfg}:seed=4", "--config.inner.lr=3")
    assert result.returncode == 0, result.stderr
    assert "VALUE Cfg(seed=4, inner=Inner(lr=3.0, kind='a'))" in result.stdout
    missing = run()
    assert missing.returncode == 1 and "--config is required" in missing.stderr


def test_optional_flag_is_none_without_config(monkeypatch, tmp_path):
    fv = flags.FlagValues()
    holder = define_config_flag("config", Optimizer, "optimizer file", flag_values=fv)
    monkeypatch.setattr(sys, "argv", ["prog"])
    fv(["prog"])
    assert holder.value is None


def test_claim_run_dir_records_then_refuses_another_config_naming_the_keys(tmp_path):
    run = tmp_path / "run"
    base = Experiment(name="a", seeds=(0, 1), optimizer=Optimizer(learning_rate=0.01))
    path = claim_run_dir(run, base, may_change={"debug", "optimizer.warmup"})
    assert path == run / "config.json" and json.loads(path.read_text()) == to_dict(base)
    assert claim_run_dir(run, base) == path  # the same config resumes
    allowed = dataclasses.replace(base, debug=True, optimizer=dataclasses.replace(base.optimizer, warmup=5))
    claim_run_dir(run, allowed, may_change={"debug", "optimizer.warmup"})
    assert json.loads(path.read_text()) == to_dict(base)  # the first record stays
    claim_run_dir(run, allowed, may_change={"debug", "optimizer"})  # a key covers everything under it
    other = dataclasses.replace(allowed, seeds=(0, 2), optimizer=Optimizer(learning_rate=0.02, warmup=5))
    with pytest.raises(RunDirError) as info:
        claim_run_dir(run, other, may_change={"debug", "optimizer.warmup"})
    assert str(info.value) == (
        f"{run} holds a run of another config (optimizer.learning_rate: 0.01 -> 0.02; seeds: [0, 1] -> [0, 2]), "
        "recorded in config.json: choose another run directory, or delete it to start over"
    )
    assert isinstance(info.value, ValueError)
    assert changes({"a": 1}, {"b": 1}) == ["a: 1 -> '<absent>'", "b: '<absent>' -> 1"]
    (run / "settings.json").write_text('{"name": ')  # a torn record
    with pytest.raises(RunDirError, match=r"settings\.json is not the JSON a run records .*delete .* to start over"):
        claim_run_dir(run, base, file="settings.json")
    assert not list(run.glob("*.partial"))


@dataclasses.dataclass(frozen=True)
class Endpoint:
    model: str = "m"
    url: str = resumable("http://a")


@dataclasses.dataclass(frozen=True)
class Job:
    run_dir: str = resumable()
    grm: Endpoint = Endpoint()
    judge: Endpoint | None = None
    steps: int = 3


def test_resumable_fields_are_what_a_rerun_may_change_through_every_nesting(tmp_path):
    """A field declared `resumable` may change on a rerun into the same run directory, in every config that nests
    its type (directly or as `X | None`); an unmarked field beside it is refused."""
    assert resumable_keys(Job) == {"run_dir", "grm.url", "judge.url"}
    first = Job(str(tmp_path), judge=Endpoint())
    claim_run_dir(tmp_path, first)
    claim_run_dir(tmp_path, Job("/elsewhere", grm=Endpoint(url="http://b"), judge=Endpoint(url="http://c")))
    with pytest.raises(RunDirError, match=r"another config \(judge\.model: 'm' -> 'n'\)"):
        claim_run_dir(tmp_path, Job(str(tmp_path), judge=Endpoint(model="n")))
    # a config recorded as a dict names its type to get the marks
    claim_run_dir(tmp_path / "d", to_dict(first))
    claim_run_dir(tmp_path / "d", to_dict(dataclasses.replace(first, run_dir="/x")), schema=Job)
    with pytest.raises(RunDirError, match=r"run_dir: "):
        claim_run_dir(tmp_path / "d", to_dict(dataclasses.replace(first, run_dir="/y")))
