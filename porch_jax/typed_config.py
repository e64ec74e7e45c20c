"""Typed configs: an ml_collections ConfigDict (or any Mapping) becomes a tree of frozen dataclasses, once, at the
launcher; code past the launcher reads attributes of those dataclasses, never a ConfigDict.

    @dataclasses.dataclass(frozen=True)
    class Optimizer:
        learning_rate: float = 1e-3
        schedule: Literal["constant", "cosine"] = "constant"

        def __post_init__(self):
            check(self.learning_rate > 0, "learning_rate", "must be > 0")

    opt = from_dict(Optimizer, {"learning_rate": 3e-4})     # Optimizer(learning_rate=0.0003, schedule='constant')
    to_dict(opt)                                             # {'learning_rate': 0.0003, 'schedule': 'constant'}

    CONFIG = define_config_flag("config", ExperimentConfig, "Experiment config file.", required=True)
    ...
    cfg: ExperimentConfig = CONFIG.value                     # inside main(), after absl parsed the flags

Every unknown key, missing required key, wrong type, choice outside a Literal or failed `__post_init__` check raises
`ConfigError` naming the dotted key (`config.optimizer.lerning_rate: unknown key (did you mean learning_rate?);
known: learning_rate, schedule`). `ConfigError` is an absl `flags.Error`: raised while absl parses the command line
(in a config file's `get_config(arg)`, or in the validator `define_config_flag` registers) it is printed as one
`FATAL Flags parsing error: ...` line and the program exits with status 1, without a traceback. (ml_collections
re-raises a ValueError from `get_config` with the traceback pasted into the message, hence not a ValueError.) Where
absl is missing (the ARE runner's venv reads configs, defines no flags) `ConfigError` is a ValueError.

Conversions are strict where a typo would otherwise pass: an int field takes an int (not a bool, not a string), a
float field takes an int or a float, a bool field takes a bool, a str field a str; a `tuple[X, ...]` field takes any
list or tuple (so a config read back from JSON converts again) and holds a tuple; `dict[str, X]` holds a dict;
`Optional[X]` takes None; `Any` / `object` takes any plain data (ConfigDicts turned into dicts).

A resumable run records its config in its run directory (`claim_run_dir`): a rerun with the same config resumes, a
rerun with another one is refused, naming the keys that differ with both values, except the fields declared with
`resumable(default)`: where a run writes, where its models are served, how patiently and by how many workers, none of
which changes what it computes. The mark sits on the field, so every config that nests the type inherits it.

Experiment variants are arguments of `get_config(arg)` in one convention, `parse_arg` (as big_vision's):
`--config=experiments/x.py:seed_set=3,benchmark=humaneval`, or a first bare value for the first key
(`--config=experiments/maca_gsm_hard.py:humaneval`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import tempfile
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, Union

try:  # the ARE runner's venv reads these configs without absl; absl is needed only to define config flags
    from absl import flags

    _ERROR_BASE: type[Exception] = flags.Error
except ImportError:  # pragma: no cover - exercised in the ARE venv
    flags = None
    _ERROR_BASE = ValueError

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "ConfigFlag",
    "RunDirError",
    "changes",
    "check",
    "claim_run_dir",
    "define_config_flag",
    "diff",
    "from_dict",
    "parse_arg",
    "refuse_other_run",
    "resumable",
    "resumable_keys",
    "to_dict",
]


class ConfigError(_ERROR_BASE):
    """A config key or value that does not fit its typed schema; the message starts with the dotted key."""


class _FieldError(ConfigError):
    """Raised by `check` inside `__post_init__`; `from_dict` prefixes the dataclass's dotted path."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check(condition: bool, field: str, message: str) -> None:
    """For `__post_init__`: raise an error naming `field` (its dotted key, once `from_dict` adds the path) unless
    `condition` holds."""
    if not condition:
        raise _FieldError(field, message)


def _plain(value: Any) -> Any:
    """A ConfigDict (FieldReferences resolved) or Mapping as a plain dict; other values unchanged."""
    if hasattr(value, "to_dict") and callable(value.to_dict) and not dataclasses.is_dataclass(value):
        return value.to_dict()
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _bad(path: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{path}: expected {expected}, got {value!r} ({type(value).__name__})")


def _convert(tp: Any, value: Any, path: str) -> Any:
    value = _plain(value)
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1:
            return _convert(arms[0], value, path)
        for arm in arms:
            try:
                return _convert(arm, value, path)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: {value!r} fits none of {', '.join(_type_name(a) for a in args)}")
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(repr(a) for a in args)}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise _bad(path, value, f"a mapping of {tp.__name__} fields")
        return _build(tp, value, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _bad(path, value, "a tuple")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if not args:
            return tuple(value)
        if len(value) != len(args):
            raise ConfigError(f"{path}: expected {len(args)} values, got {len(value)} ({value!r})")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _bad(path, value, "a list")
        inner = args[0] if args else Any
        return [_convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _bad(path, value, "a mapping")
        key_tp, val_tp = args if args else (Any, Any)
        return {_convert(key_tp, k, f"{path}.{k}"): _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _bad(path, value, "a bool")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _bad(path, value, "an int")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _bad(path, value, "a float")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _bad(path, value, "a str")
    if tp is type(None):
        if value is None:
            return None
        raise _bad(path, value, "None")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _bad(path, value, tp.__name__)
    raise ConfigError(f"{path}: unsupported field type {tp!r}")


def _build(cls: type[T], data: Mapping, path: str) -> T:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    known = list(fields)
    for key in data:
        if key not in fields:
            raise ConfigError(f"{path}.{key}: unknown key{_suggest(str(key), known)}; known: {', '.join(known)}")
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{path}.{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path}.{name}: missing required key ({_type_name(hints[name])})")
    try:
        return cls(**kwargs)
    except _FieldError as e:
        raise ConfigError(f"{path}.{e.field}: {e.message}") from None
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None


def from_dict(cls: type[T], data: Any, *, path: str = "config", base: T | None = None) -> T:
    """`cls` (a dataclass) built from `data` (a ConfigDict or Mapping, nested as `cls`'s fields are); fields absent
    from `data` take their defaults, or with `base` (a `cls`) base's values, merged field by field through nested
    mappings (a partial mapping over a config, e.g. parsed JSON). Raises `ConfigError` naming the dotted key (rooted
    at `path`)."""
    data = _plain(data)
    if not isinstance(data, Mapping):
        raise _bad(path, data, f"a mapping of {cls.__name__} fields")
    return _build(cls, data if base is None else _merge(to_dict(base), data), path)


def _merge(base: Mapping, changes: Mapping) -> dict:
    out = dict(base)
    for key, value in _plain(changes).items():
        value = _plain(value)
        both = isinstance(out.get(key), Mapping) and isinstance(value, Mapping)
        out[key] = _merge(out[key], value) if both else value
    return out


def to_dict(obj: Any) -> Any:
    """`obj` (a dataclass tree) as JSON-able plain data: dataclasses and mappings as dicts, tuples as lists.
    `from_dict(type(obj), to_dict(obj)) == obj`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    obj = _plain(obj)
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs (dataclasses or their `to_dict` forms), sorted; a
    key present on one side only counts as differing."""
    a, b = to_dict(a), to_dict(b)
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in a or key not in b:
                out.append(name)
            else:
                out.extend(diff(a[key], b[key], name))
        return out
    return [] if a == b else [prefix or "<root>"]


def changes(before: Any, after: Any, *, ignore: Iterable[str] = (), prefix: str = "") -> list[str]:
    """ "key: before -> after" for each dotted key whose value differs between two configs (dataclasses or their
    `to_dict` forms), in key order; a key in `ignore` is left out with everything under it, and a key on one side
    only shows as '<absent>' on the other."""
    return _changes(to_dict(before), to_dict(after), frozenset(ignore), prefix)


_NO_DEFAULT = object()


def _changes(before: Any, after: Any, ignore: frozenset[str], key: str, defaults: Any = _NO_DEFAULT) -> list[str]:
    """ "key: before -> after" per dotted key whose value differs, except keys in `ignore` and keys the record
    lacks whose current value is their default (a field added since the run was recorded, keeping its behaviour)."""
    if key in ignore:
        return []
    if before == "<absent>" and defaults is not _NO_DEFAULT and after == defaults:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        nested = defaults if isinstance(defaults, dict) else {}
        return [
            change
            for k in sorted(set(before) | set(after), key=str)
            for change in _changes(
                before.get(k, "<absent>"),
                after.get(k, "<absent>"),
                ignore,
                f"{key}.{k}" if key else str(k),
                nested.get(k, _NO_DEFAULT),
            )
        ]
    return [] if before == after else [f"{key or '<root>'}: {before!r} -> {after!r}"]


_RESUMABLE = "porch_jax.resumable"


def resumable(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field a relaunch into the same run directory may change (`claim_run_dir`): where the run is
    written or served, how patiently, by how many workers. Not a field that changes what the run computes."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_RESUMABLE: True})


def _dataclass_types(tp: Any) -> list[type]:
    """The dataclass types a field of type `tp` may hold (`X`, `X | None`)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [t for arg in typing.get_args(tp) for t in _dataclass_types(arg)]
    return []


@functools.cache
def resumable_keys(cls: type) -> frozenset[str]:
    """The dotted keys of every `resumable` field in the config type `cls` and the dataclasses it nests."""
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get(_RESUMABLE):
            out.add(f.name)
            continue
        for sub in _dataclass_types(_hints(cls)[f.name]):
            out |= {f"{f.name}.{k}" for k in resumable_keys(sub)}
    return frozenset(out)


class RunDirError(ValueError):
    """A run directory that holds a run of another config, or a config record that does not read; the message
    names the directory and the keys that differ."""


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """`text` as the file `path`, written beside it and moved into place: a reader or a crash sees the old file or
    the new one, never a part."""
    path = Path(path)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def claim_run_dir(
    run_dir: str | os.PathLike[str],
    config: Any,
    *,
    may_change: Iterable[str] = (),
    file: str = "config.json",
    defaults: Any = None,
    schema: type | None = None,
) -> Path:
    """Makes `run_dir` the run of `config` (a dataclass, or its `to_dict` form with its type as `schema`): records it
    as RUN_DIR/`file` where no run has yet, or checks that the recorded config is the same but for its `resumable`
    fields and the dotted keys in `may_change` (each with everything under it), so a rerun after a crash resumes and
    another config never resumes another run's state. The first record stays. With `defaults` (the config's
    defaults, a dataclass or its dict) a key the record lacks is no difference while its value is its default.
    Raises `RunDirError` naming the keys that differ, with both values. Returns the record's path."""
    schema = type(config) if schema is None and dataclasses.is_dataclass(config) else schema
    may_change = frozenset(may_change) | (resumable_keys(schema) if schema is not None else frozenset())
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path, current = run_dir / file, json.loads(json.dumps(to_dict(config)))
    if not path.exists():
        write_atomic(path, json.dumps(current, indent=2, sort_keys=True) + "\n")  # a crash never leaves a torn record
        return path
    try:
        recorded = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(
            f"{path} is not the JSON a run records ({e}): restore it, or delete {run_dir} to start over"
        ) from e
    refuse_other_run(run_dir, path.name, recorded, current, may_change=may_change, defaults=defaults)
    return path


def refuse_other_run(
    where: str | os.PathLike[str],
    record: str,
    recorded: Any,
    current: Any,
    *,
    may_change: Iterable[str] = (),
    defaults: Any = None,
) -> None:
    """The one "is this directory's run ours?" check, for a run directory's config record (`claim_run_dir`) and a
    checkpoint's recorded identity (the trainer): raises `RunDirError` naming `where`, the keys of `recorded` and
    `current` (JSON-like) that differ but for those under `may_change`, with both values, and `record`, where the
    recorded values live. With `defaults`, a key the record lacks is no difference while its value is its default."""
    known = _NO_DEFAULT if defaults is None else json.loads(json.dumps(to_dict(defaults)))
    differ = _changes(
        json.loads(json.dumps(recorded)), json.loads(json.dumps(current)), frozenset(may_change), "", known
    )
    if differ:
        shown = "; ".join(differ[:8]) + ("; ..." if len(differ) > 8 else "")
        raise RunDirError(
            f"{where} holds a run of another config ({shown}), recorded in {record}: choose another run "
            "directory, or delete it to start over"
        )


def _parse_scalar(text: str, default: Any, key: str) -> Any:
    if isinstance(default, bool):
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"config argument {key}: expected a bool, got {text!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"config argument {key}: expected an int, got {text!r}") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"config argument {key}: expected a float, got {text!r}") from None
    return text


def parse_arg(arg: str | None, **spec: Any) -> types.SimpleNamespace:
    """`get_config(arg)`'s argument, `key=value` pairs separated by commas (`seed_set=3,benchmark=humaneval`),
    parsed against `spec` (each key's default, whose type types the value: bool, int, float or str). A bare `key`
    whose default is a bool sets it True; a bare first value that is no key binds the first key of `spec`
    (`humaneval` = `benchmark=humaneval` for `parse_arg(arg, benchmark="gsm_hard")`). An unknown key or a bad
    value raises `ConfigError` naming it."""
    values = dict(spec)
    known = list(spec)
    tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
    for i, token in enumerate(tokens):
        if "=" in token:
            key, text = (s.strip() for s in token.split("=", 1))
        elif token in spec and isinstance(spec[token], bool):
            key, text = token, "true"
        elif i == 0 and known:
            key, text = known[0], token
        else:
            raise ConfigError(f"config argument {token!r}: expected key=value; keys: {', '.join(known)}")
        if key not in spec:
            raise ConfigError(f"config argument {key}: unknown key{_suggest(key, known)}; known: {', '.join(known)}")
        values[key] = _parse_scalar(text, spec[key], key)
    return types.SimpleNamespace(**values)


def _missing_key(config: Any, override: str, root: str) -> str | None:
    """The first key of the dotted `override` path that `config` lacks, as a `ConfigError` message; None if the
    path's parents all exist."""
    node, path = config, root
    for key in override.split(".")[:-1]:
        keys = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
        if key not in keys:
            return f"{path}.{key}: unknown key{_suggest(key, keys)}; known: {', '.join(keys)}"
        node, path = node[key], f"{path}.{key}"
    return None


def _name_missing_override_parents(flag: Any, name: str) -> None:
    """ml_collections fails with a raw KeyError / AttributeError traceback on an override below a key the config
    does not have (`--config.nonexistent.deep=3`): the flag's parse names that key as a `ConfigError` instead."""
    original = flag._parse

    def parse(argument: Any) -> Any:
        try:
            return original(argument)
        except (AttributeError, KeyError) as e:
            message = None
            try:
                config = flag.parser.parse(argument)
                for override in flag._GetOverrides(flag._GetArgv()):
                    message = message or _missing_key(config, override, name)
            except Exception:  # noqa: BLE001 - the fallback message below still names the key
                message = None
            raise ConfigError(message or f"{name}: an override names a key the config lacks ({e})") from None

    flag._parse = parse


class ConfigFlag(Generic[T]):
    """The typed value of a config-file flag, built and validated while absl parses the command line."""

    def __init__(self, name: str, flag_values: flags.FlagValues):
        self.name = name
        self._flag_values = flag_values
        self._value: T | None = None

    @property
    def value(self) -> T | None:
        """The typed config (None where the optional flag is not given); read it after absl parsed the flags."""
        return self._value

    @property
    def config_dict(self) -> Any:
        """The ConfigDict as the config file and the overrides made it (for the launcher, not for the library)."""
        return self._flag_values[self.name].value


def define_config_flag(
    name: str,
    cls: type[T],
    help_string: str,
    *,
    required: bool = False,
    select: Callable[[Any], Any] | None = None,
    section: str | None = None,
    flag_values: flags.FlagValues | None = None,
) -> ConfigFlag[T]:
    """An ml_collections config-file flag (`--NAME=file.py[:arg]`, `--NAME.key=value` overrides) whose value is
        converted to `cls` once absl has applied every override. An unknown override key (accepted into the ConfigDict,
        so ml_collections does not fail on it with a traceback), a bad value or a missing required flag is a
        `ConfigError`: absl reports it as a flags error naming the key. `select` picks the part of the ConfigDict that
        `cls` describes (default: all of it); `section` names a key whose value `cls` describes where the config has it
    (the whole config where it does not), and errors then name `NAME.section.key`. `flag_values`: absl's FLAGS by
    default."""
    from ml_collections import config_flags

    flag_values = flags.FLAGS if flag_values is None else flag_values
    config_flags.DEFINE_config_file(
        name, None, help_string, lock_config=False, accept_new_attributes=True, flag_values=flag_values
    )
    holder: ConfigFlag[T] = ConfigFlag(name, flag_values)
    _name_missing_override_parents(flag_values[name], name)

    def validate(config: Any) -> bool:
        if config is None:
            if required:
                raise ConfigError(f"--{name} is required ({help_string})")
            holder._value = None
            return True
        path = name
        if select is not None:
            config = select(config)
        if section is not None and section in config:
            config, path = config[section], f"{name}.{section}"
        holder._value = from_dict(cls, config, path=path)
        return True

    flags.register_validator(name, validate, flag_values=flag_values)
    return holder
