"""Store round trip, schema errors naming file/line/field, torn-line policy, single writer."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from porch_jax.trajectories import (
    SCHEMA_VERSION,
    DecisionRecord,
    EpisodeRecord,
    Outcome,
    RecordError,
    RoleCost,
    SubStep,
    TrajectoryStore,
)


def make_record(i: int = 0, text: str = "hello") -> EpisodeRecord:
    step = SubStep(agent_id=0, harness_version=1, kind="tool", text=text, tool="search", observation="obs")
    decision = DecisionRecord(
        index=0,
        context=[{"role": "system", "content": "s"}, {"role": "user", "content": text}],
        action_text='<tool_call>\n{"name": "finish", "arguments": {"answer": "a"}}\n</tool_call>',
        action_token_ids=[1, 2, 3],
        action_logprobs=[-0.5, -1.0, -math.inf],
        action={"name": "finish", "arguments": {"answer": "a"}},
        feedback="[agent 0 submit]",
        agent_id=0,
        segment=[step],
    )
    bad = DecisionRecord(
        index=1,
        context=[],
        action_text="junk",
        action_token_ids=[],
        action_logprobs=[],
        action=None,
        parse_error="no_tool_call",
        feedback="Error",
    )
    return EpisodeRecord(
        episode_id=f"ep{i}",
        task_id=f"t{i}",
        env="workplace",
        system="porch",
        config_hash="abc",
        seed=i,
        outcome=Outcome(success=True, score=1.0, reason="answer matched"),
        cost={"orchestrator": RoleCost(2, 30, 5), "subagent": RoleCost(4, 80, 20)},
        decisions=[decision, bad],
        meta={"note": text},
    )


@settings(max_examples=30, deadline=None)
@given(st.text())
def test_round_trip(tmp_path_factory, text):
    store = TrajectoryStore(tmp_path_factory.mktemp("s") / "ep.jsonl")
    records = [make_record(i, text) for i in range(3)]
    store.append(records[0])
    store.append_many(records[1:])
    assert store.read() == records
    assert store.episode_ids() == {"ep0", "ep1", "ep2"}
    assert all(json.loads(line)["schema_version"] == SCHEMA_VERSION for line in store.path.read_text().splitlines())


def test_lone_surrogate_is_storable(tmp_path):
    store = TrajectoryStore(tmp_path / "ep.jsonl")
    store.append(make_record(0, "bad \ud800 decode"))
    assert store.read()[0].meta["note"] == "bad \ud800 decode"


def _line(**changes):
    d = make_record().to_dict()
    for path, value in changes.items():
        target, *keys = path.split(".")
        obj = d
        for k in [target, *keys][:-1]:
            obj = obj[int(k)] if isinstance(obj, list) else obj[k]
        last = [target, *keys][-1]
        if value is KeyError:
            del obj[last]
        else:
            obj[int(last) if isinstance(obj, list) else last] = value
    return json.dumps(d)


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"seed": "3"}, "seed"),
        ({"outcome.success": 1}, "outcome.success"),
        ({"outcome.reason": KeyError}, "outcome.reason"),
        ({"decisions.0.action_token_ids": [1, "2"]}, "decisions[0].action_token_ids[1]"),
        ({"decisions.0.segment.0.kind": "thought"}, "decisions[0].segment[0].kind"),
        ({"cost.subagent.calls": 1.5}, "cost.subagent.calls"),
        ({"decisions.1.extra": 1}, "decisions[1].extra"),
        ({"schema_version": 99}, "schema_version"),
    ],
)
def test_bad_line_names_file_line_field(tmp_path, changes, field):
    path = tmp_path / "ep.jsonl"
    path.write_text(_line() + "\n" + _line(**changes) + "\n")
    with pytest.raises(RecordError) as info:
        TrajectoryStore(path).read()
    e = info.value
    assert (e.path, e.line, e.field) == (str(path), 2, field)
    assert f"{path}:2:" in str(e) and field in str(e)


def test_invalid_json_line(tmp_path):
    path = tmp_path / "ep.jsonl"
    path.write_text("{not json\n" + _line() + "\n")
    with pytest.raises(RecordError, match=r"ep.jsonl:1: not valid JSON"):
        TrajectoryStore(path).read()


def test_writer_rejects_invalid_record_before_writing(tmp_path):
    store = TrajectoryStore(tmp_path / "ep.jsonl")
    bad = make_record()
    bad.seed = "7"  # type: ignore[assignment]
    with pytest.raises(RecordError, match="seed"):
        store.append_many([make_record(1), bad])
    assert store.read() == []  # all or nothing


def test_torn_last_line_is_ignored_then_repaired(tmp_path, caplog):
    path = tmp_path / "ep.jsonl"
    store = TrajectoryStore(path)
    store.append(make_record(0))
    store.close()
    torn = _line()[:57]
    with open(path, "a") as f:
        f.write(torn)  # a kill -9 in the middle of a write
    assert [r.episode_id for r in TrajectoryStore(path).read()] == ["ep0"]
    assert "torn last line" in caplog.text
    with TrajectoryStore(path) as writer:
        writer.append(make_record(1))
    assert [r.episode_id for r in TrajectoryStore(path).read()] == ["ep0", "ep1"]
    assert (tmp_path / "ep.jsonl.torn").read_text() == torn + "\n"


def test_torn_only_line(tmp_path):
    path = tmp_path / "ep.jsonl"
    path.write_text('{"schema')
    assert TrajectoryStore(path).read() == []
    TrajectoryStore(path).append(make_record(0))
    assert len(TrajectoryStore(path).read()) == 1


def test_one_writer_per_file(tmp_path):
    a, b = TrajectoryStore(tmp_path / "ep.jsonl"), TrajectoryStore(tmp_path / "ep.jsonl")
    a.append(make_record(0))
    with pytest.raises(RuntimeError, match="another"):
        b.append(make_record(1))
    a.close()
    b.append(make_record(1))
    assert len(b.read()) == 2


def test_keyword_only_episode_record():
    with pytest.raises(TypeError):
        EpisodeRecord(1, "ep", "t", "env", "sys", "hash", 0, Outcome(True, 1.0, ""))  # type: ignore[misc]


def test_version_1_records_read_with_inferred_token_sources():
    d = json.loads(_version_1_line(0))
    record = EpisodeRecord.from_dict(d)
    assert record.schema_version == SCHEMA_VERSION == 3
    assert [x.token_source for x in record.decisions] == ["sampler", "none"]  # ids present: our sampler's
    d["decisions"][0]["token_source"] = "server"
    with pytest.raises(RecordError, match=r"decisions\[0\]\.token_source.*not a field of schema_version 1"):
        EpisodeRecord.from_dict(d)


def test_token_source_is_checked():
    d = make_record().to_dict()
    d["decisions"][0]["token_source"] = "guessed"
    with pytest.raises(RecordError, match=r"decisions\[0\]\.token_source.*must be one of"):
        EpisodeRecord.from_dict(d)


def _version_1_line(i: int) -> str:
    """A line as a store written before schema version 2 holds it: no token provenance, no server prompt ids, no
    retryable outcome."""
    d = json.loads(_version_2_line(i))
    d["schema_version"] = 1
    for decision in d["decisions"]:
        del decision["token_source"], decision["prompt_token_ids"]
    return json.dumps(d)


def _version_2_line(i: int) -> str:
    """A line as a store written before schema version 3 holds it: outcomes without ``retryable``."""
    d = make_record(i).to_dict()
    d["schema_version"] = 2
    del d["outcome"]["retryable"]
    return json.dumps(d)


@pytest.mark.parametrize("version", [1, 2])
def test_older_outcomes_read_as_finished_and_may_not_claim_retryable(version):
    d = json.loads(_version_1_line(0) if version == 1 else _version_2_line(0))
    assert EpisodeRecord.from_dict(d).outcome.retryable is False
    d["outcome"]["retryable"] = True
    with pytest.raises(RecordError, match=rf"outcome\.retryable.*not a field of schema_version {version}"):
        EpisodeRecord.from_dict(d)


def test_retryable_attempts_are_kept_but_only_finished_records_are_read(tmp_path):
    def attempt(i: int, retryable: bool) -> EpisodeRecord:
        r = make_record(i)
        r.outcome = (
            Outcome(False, 0.0, "backend_unavailable: connection refused", retryable=True) if retryable else (r.outcome)
        )
        return r

    store = TrajectoryStore(tmp_path / "ep.jsonl")
    # ep0 finished at once; ep1 retryable, then finished by a rerun; ep2 retryable twice, not finished yet
    store.append_many([attempt(0, False), attempt(1, True), attempt(2, True), attempt(1, False), attempt(2, True)])
    assert [r.episode_id for r in store.read()] == ["ep0", "ep1"]
    assert store.episode_ids() == {"ep0", "ep1"} and store.retryable_ids() == {"ep2"}
    assert [(r.episode_id, r.outcome.retryable) for r in store] == [
        ("ep0", False),
        ("ep1", True),
        ("ep2", True),
        ("ep1", False),
        ("ep2", True),
    ]


def test_a_version_1_store_reads_and_resumes_with_current_lines(tmp_path):
    path = tmp_path / "ep.jsonl"
    path.write_text(_version_1_line(0) + "\n" + _version_1_line(1) + "\n")
    old = TrajectoryStore(path).read()
    assert [r.schema_version for r in old] == [SCHEMA_VERSION] * 2
    assert [d.token_source for d in old[0].decisions] == ["sampler", "none"]
    with TrajectoryStore(path) as writer:  # a resumed run appends current records to the old store
        writer.append(make_record(2))
    assert [r.episode_id for r in TrajectoryStore(path).read()] == ["ep0", "ep1", "ep2"]
    assert [json.loads(line)["schema_version"] for line in path.read_text().splitlines()] == [1, 1, SCHEMA_VERSION]


@pytest.mark.parametrize("version", [99, 0, "2", None])
def test_a_line_of_a_version_this_code_does_not_know_is_refused_by_name(tmp_path, version):
    path = tmp_path / "ep.jsonl"
    path.write_text(_version_1_line(0) + "\n" + _line(schema_version=version) + "\n")
    expected = f"{path}:2: field 'schema_version': unsupported schema_version {version!r} (this code reads 1, 2, 3)"
    for read in (TrajectoryStore(path).read, TrajectoryStore(path).episode_ids):  # episode_ids: what a resume reads
        with pytest.raises(RecordError) as info:
            read()
        assert str(info.value) == expected
