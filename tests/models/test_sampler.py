"""The KV-cache sampler against transformers' PyTorch generate and our own full forward pass."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from porch_jax.models import from_pretrained
from porch_jax.models.sampler import Sampler, SamplingParams
from porch_jax.models.tiny import make_tiny_model

# Few buckets and one new-token bucket (17-32), so the whole file compiles only a handful of times.
BUCKETS = {"max_len": 128, "prompt_buckets": (16, 64), "batch_buckets": (1, 4)}
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # A larger init than HF's 0.02 gives peaked logits: greedy paths are varied and free of near-ties.
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=3, initializer_range=0.3, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def model(folder):
    return from_pretrained(folder)


@pytest.fixture(scope="module")
def sampler(model, tokenizer):
    return Sampler(model, tokenizer, **BUCKETS)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = [
        "Find the invoice.",
        "The morning shift began, as it always did, with a list of tasks.",
        "Hi",
        "Which of my contacts live in Porto?",
        "Delegate the search to a worker with a budget of six steps.",
    ]
    return [tokenizer(t)["input_ids"] for t in texts]


def test_greedy_matches_transformers_generate(folder, sampler, prompts):
    torch = pytest.importorskip(
        "torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it"
    )
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    params = dataclasses.replace(GREEDY, max_new_tokens=32)
    for prompt, completion in zip(prompts[:3], sampler.generate(prompts[:3], params), strict=False):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32, min_new_tokens=32)
        assert completion.token_ids == out[0, len(prompt) :].tolist()
        assert completion.finish_reason == "length"


def test_logprobs_are_raw_model_logprobs(model, sampler, prompts):
    params = [SamplingParams(max_new_tokens=20, temperature=1.3, top_k=5, seed=i, ignore_eos=True) for i in range(3)]
    completions = sampler.generate(prompts[:3], params)
    # One full causal forward pass over prompt + completion (right padding cannot affect it).
    rows = [p + c.token_ids for p, c in zip(prompts, completions, strict=False)]
    width = max(map(len, rows))
    full = nnx.jit(lambda m, ids: m(ids))(model, np.array([r + [0] * (width - len(r)) for r in rows], np.int32))
    for prompt, completion, row_logits in zip(prompts, completions, np.asarray(full), strict=False):
        logits = row_logits[len(prompt) - 1 : len(prompt) + len(completion.token_ids) - 1]
        logprobs = np.asarray(jax.nn.log_softmax(logits))
        sampled = np.asarray(completion.token_ids)
        np.testing.assert_allclose(completion.logprobs, logprobs[np.arange(len(sampled)), sampled], atol=1e-4)
        # Every sampled token is among the 5 most likely ones.
        rank = (logits > logits[np.arange(len(sampled)), sampled][:, None]).sum(axis=1)
        assert rank.max() < 5


def test_compiles_at_most_once_per_bucket(model, tokenizer):
    buckets = (8, 16, 32)
    sampler = Sampler(model, tokenizer, max_len=64, prompt_buckets=buckets, batch_buckets=(1,))
    lengths = [1, 3, 7, 8, 9, 13, 16, 20, 25, 31]
    for _ in range(2):
        for n in lengths:
            sampler.generate([list(range(100, 100 + n))], GREEDY)
    assert sampler.num_compiles <= len(buckets)


def test_batched_equals_one_at_a_time(sampler, prompts):
    batched = sampler.generate(prompts, GREEDY)  # 5 prompts: a batch of 4, then one
    for prompt, together in zip(prompts, batched, strict=False):
        (alone,) = sampler.generate([prompt], GREEDY)
        assert together.token_ids == alone.token_ids
        np.testing.assert_allclose(together.logprobs, alone.logprobs, atol=1e-4)
        assert together.prompt_token_ids == prompt


def test_seeded_sampling_is_reproducible(sampler, prompts):
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    first = sampler.generate(prompts[:2] * 2, params)
    again = sampler.generate(prompts[:2] * 2, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    # One params for all seeds request i with seed + i: a repeated prompt draws a different sample.
    assert first[0].token_ids != first[2].token_ids
    other = sampler.generate(prompts[:1], dataclasses.replace(params, seed=8))
    assert other[0].token_ids != first[0].token_ids
    # A request's sample depends on its seed, not on its neighbours in the batch.
    explicit = sampler.generate([prompts[1], prompts[0]], [dataclasses.replace(params, seed=8), params])
    assert explicit[0].token_ids == first[1].token_ids and explicit[1].token_ids == first[0].token_ids


def test_top_k_one_and_tiny_top_p_equal_greedy(sampler, prompts):
    greedy = [c.token_ids for c in sampler.generate(prompts, GREEDY)]
    for filtered in ({"top_k": 1}, {"top_p": 1e-6}):
        params = dataclasses.replace(GREEDY, temperature=1.5, seed=11, **filtered)
        assert [c.token_ids for c in sampler.generate(prompts, params)] == greedy


def test_greedy_and_sampled_rows_share_a_batch(sampler, prompts):
    (greedy,) = sampler.generate(prompts[:1], GREEDY)
    hot = dataclasses.replace(GREEDY, temperature=2.0, seed=1)
    mixed = sampler.generate(prompts[:2], [GREEDY, hot])
    assert mixed[0].token_ids == greedy.token_ids
    assert mixed[1].token_ids != sampler.generate(prompts[1:2], GREEDY)[0].token_ids


def test_stop_token_ids_end_with_stop(sampler, prompts):
    (full,) = sampler.generate(prompts[:1], GREEDY)
    stop = full.token_ids[5]
    first = full.token_ids.index(stop)
    (cut,) = sampler.generate(prompts[:1], dataclasses.replace(GREEDY, stop_token_ids=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[: first + 1]
    assert cut.logprobs == pytest.approx(full.logprobs[: first + 1], abs=1e-5)


def test_eos_stops_by_default_unless_ignored(sampler, prompts, monkeypatch):
    (full,) = sampler.generate(prompts[:1], GREEDY)
    monkeypatch.setattr(sampler, "eos_ids", {full.token_ids[3]})
    (stopped,) = sampler.generate(prompts[:1], dataclasses.replace(GREEDY, ignore_eos=False))
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) <= 4
    assert sampler.generate(prompts[:1], GREEDY)[0].token_ids == full.token_ids


def test_stop_strings_truncate_text_and_tokens(sampler, tokenizer, prompts):
    (full,) = sampler.generate(prompts[:1], GREEDY)
    assert full.text == tokenizer.decode(full.token_ids, skip_special_tokens=True)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    (cut,) = sampler.generate(prompts[:1], dataclasses.replace(GREEDY, stop=(stop, "never appears")))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    n = len(cut.token_ids)
    assert cut.token_ids == full.token_ids[:n] and len(cut.logprobs) == n
    assert stop in tokenizer.decode(cut.token_ids) and stop not in tokenizer.decode(cut.token_ids[:-1])


def test_max_new_tokens_ends_with_length(sampler, prompts):
    completions = sampler.generate(prompts[:2], [dataclasses.replace(GREEDY, max_new_tokens=n) for n in (3, 20)])
    assert [len(c.token_ids) for c in completions] == [3, 20]
    assert {c.finish_reason for c in completions} == {"length"}


def test_chat_uses_the_chat_template(sampler, tokenizer):
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Find the invoice."}]
    (completion,) = sampler.chat([conversation], GREEDY)
    expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)["input_ids"]
    assert completion.prompt_token_ids == expected
    assert completion.token_ids == sampler.generate([expected], GREEDY)[0].token_ids


def test_bad_requests_are_rejected(sampler):
    with pytest.raises(ValueError, match="prompt 1 has 65 tokens"):
        sampler.generate([[1], [1] * 65], GREEDY)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        sampler.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=4, top_p=0.0)


def test_sampling_frequencies_follow_the_filtered_distribution():
    from porch_jax.models.sampler import _sample

    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    # (temperature, top_k, top_p, how many of the most likely tokens survive the filters)
    settings = [(1.0, 0, 1.0, 6), (0.5, 0, 1.0, 6), (1.0, 3, 1.0, 3), (1.0, 0, 0.7, 3), (2.0, 4, 0.5, 2)]
    rows = 20_000  # per setting; all settings share one batch, as requests do
    temperature, top_k, top_p, _ = (np.repeat(np.array(column), rows) for column in zip(*settings, strict=False))
    logits = np.tile(np.log(probs), (len(temperature), 1)).astype(np.float32)
    keys = jax.vmap(jax.random.key)(np.arange(len(temperature), dtype=np.uint32))
    tokens, logprobs = jax.jit(_sample)(
        logits, keys, 0, temperature.astype(np.float32), top_p.astype(np.float32), top_k.astype(np.int32)
    )
    tokens = np.asarray(tokens).reshape(len(settings), rows)
    for (t, _, _, kept), drawn in zip(settings, tokens, strict=False):
        expected = np.where(np.arange(6) < kept, probs ** (1 / t), 0.0)
        np.testing.assert_allclose(np.bincount(drawn, minlength=6) / rows, expected / expected.sum(), atol=0.015)
    np.testing.assert_allclose(logprobs, np.log(probs)[tokens.ravel()], atol=1e-5)  # raw, not tempered


def test_single_token_stop_string_ends_the_row_on_device(sampler, tokenizer, prompts):
    (full,) = sampler.generate(prompts[:1], GREEDY)
    target = next(t for t in full.token_ids[2:] if len(tokenizer.decode([t]).strip()) > 1)
    stop = tokenizer.decode([target])
    assert tokenizer.encode(stop, add_special_tokens=False) == [target]
    params = dataclasses.replace(GREEDY, stop=(stop,))
    assert target in sampler._stop_ids(params)
    (cut,) = sampler.generate(prompts[:1], params)
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and cut.token_ids[-1] == target


def test_a_mesh_splits_rows_over_devices_and_draws_the_same_samples(folder, tokenizer, sampler, prompts):
    """With the trainer's mesh the sampler runs over its devices (rows over the batch axes, weights sharded) and
    returns what one device draws: each row's draws depend on its seed alone."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 host devices (tests/conftest.py sets 8)")
    from porch_jax.models.sharding import MESH_AXES

    auto = (jax.sharding.AxisType.Auto,) * 3
    mesh = jax.make_mesh((1, 2, 2), MESH_AXES, axis_types=auto, devices=jax.devices()[:4])
    sharded = Sampler(from_pretrained(folder, mesh=mesh), tokenizer, mesh=mesh, **BUCKETS)
    assert sharded.batch_buckets == (2, 4)  # rounded up to the mesh's 2 batch shards
    params = [SamplingParams(max_new_tokens=24, temperature=1.0, seed=s, ignore_eos=True) for s in range(5)]
    for want, got in zip(sampler.generate(prompts, params), sharded.generate(prompts, params), strict=True):
        assert got.token_ids == want.token_ids
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)


def _conversations(tokenizer, prompts, turns: int, sampler) -> list[list[list[int]]]:
    """Per prompt, `turns` prompts of one conversation: each the last, its greedy reply and a new user line."""
    out = []
    for p in prompts[:3]:
        history, seq = [], list(p)
        for t in range(turns):
            history.append(list(seq))
            reply = sampler.generate([seq], dataclasses.replace(GREEDY, max_new_tokens=12))[0].token_ids
            seq = seq + reply + tokenizer(f" then {t}?")["input_ids"]
        out.append(history)
    return out


def test_prefix_reuse_gives_the_uncached_tokens_and_logprobs(model, tokenizer, sampler, prompts):
    """A conversation's next prompt extends the last one and its reply: the reusing sampler prefills only the new
    tokens, in batches whose rows reuse prefixes of different lengths, and samples what the uncached one does."""
    reusing = Sampler(model, tokenizer, **BUCKETS, prefix_cache_bytes=2**26)
    conversations = _conversations(tokenizer, prompts, 3, sampler)
    for turn in range(3):
        batch = [c[turn] for c in conversations] + [prompts[4]]  # one row that extends nothing
        want = sampler.generate(batch, GREEDY)
        got = reusing.generate(batch, GREEDY)
        for g, w in zip(got, want, strict=True):
            assert g.token_ids == w.token_ids
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    stats = reusing.prefixes.stats()
    assert stats["hits"] >= 6 and stats["reused_fraction"] > 0.5, stats  # turns 2 and 3 reuse most of each prompt


def test_a_scored_row_is_reused_by_a_generation_that_extends_it(model, tokenizer, sampler, prompts):
    """The held GRM scores its flag after a prompt, then generates the hint after the prompt and the flag: with a
    prefix cache the scoring pass keeps each row's keys and values, the generation prefills only what it adds, and
    both give what the uncached sampler gives."""
    reusing = Sampler(model, tokenizer, **BUCKETS, prefix_cache_bytes=2**26)
    rows = [p + list(range(20, 40)) for p in prompts[:3]]  # each long enough to be worth reusing
    candidates = [11, 12, 13]
    np.testing.assert_allclose(
        reusing.next_token_logprobs(rows, candidates), sampler.next_token_logprobs(rows, candidates), atol=1e-5
    )
    assert len(reusing.prefixes) == 3  # one entry a scored row
    extended = [r + [9, 10, 11] for r in rows]
    got, want = reusing.generate(extended, GREEDY), sampler.generate(extended, GREEDY)
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    stats = reusing.prefixes.stats()
    assert stats["hits"] == 3 and stats["reused_tokens"] == sum(len(r) for r in rows), stats


def test_the_prefix_cache_is_bounded_and_cleared_when_the_weights_change(model, tokenizer, prompts):
    reusing = Sampler(model, tokenizer, **BUCKETS, prefix_cache_bytes=2**26)
    reusing.generate(prompts[:4], GREEDY)
    assert len(reusing.prefixes) == 4 and 0 < reusing.prefixes.bytes <= 2**26
    one = reusing.prefixes.bytes // 4
    small = Sampler(model, tokenizer, **BUCKETS, prefix_cache_bytes=int(2.5 * one))
    small.generate(prompts[:4], GREEDY)
    assert len(small.prefixes) <= 2 and small.prefixes.bytes <= int(2.5 * one)  # least recently used out first
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 1.0, params))  # new arrays: a trainer's update
    reusing.generate(prompts[:1], GREEDY)
    assert len(reusing.prefixes) == 1  # the other weights' entries went


def test_prefix_reuse_needs_a_plain_kv_cache_and_no_mesh(folder, tokenizer):
    from porch_jax.train.mesh import make_mesh

    with pytest.raises(ValueError, match="prefix reuse"):
        Sampler(from_pretrained(folder), tokenizer, mesh=make_mesh((1, 2, 1)), prefix_cache_bytes=2**20)


def test_score_is_the_sum_of_the_raw_logprobs_of_a_continuation(sampler, prompts):
    """A greedy completion scored after its prompt gives the sum of the logprobs the sampler reported for it; a
    batch of prompts of different lengths scores each row as it would alone."""
    done = sampler.generate(prompts[:4], dataclasses.replace(GREEDY, max_new_tokens=6))
    scores = sampler.score(prompts[:4], [c.token_ids for c in done])
    for s, c in zip(scores, done, strict=True):
        assert s == pytest.approx(sum(c.logprobs), abs=1e-4)
    assert sampler.score(prompts[1:2], [done[1].token_ids]) == pytest.approx(scores[1:2], abs=1e-5)
    with pytest.raises(ValueError, match="non-empty"):
        sampler.score(prompts[:1], [[]])
    # one-token continuations read from one row per prompt: the same as scoring each
    nexts = sampler.next_token_logprobs(prompts[:3], [5, 17])
    singles = sampler.score([p for p in prompts[:3] for _ in range(2)], [[5], [17]] * 3)
    np.testing.assert_allclose(np.ravel(nexts), singles, atol=1e-5)


def test_a_token_budget_bounds_each_forward_and_changes_no_result(model, tokenizer, sampler, prompts, monkeypatch):
    """`max_batch_tokens` cuts a call into batches whose padded prompt tokens (batch bucket x prompt bucket) stay
    within it, a prompt alone always going; tokens, logprobs and scores are the unbounded sampler's."""
    budget = 64  # the prompts (2, 5, 13, 18 and 22 tokens): 3 + 1 + 1 per call, where 4 + 1 go unbounded
    bounded = Sampler(model, tokenizer, **(BUCKETS | {"batch_buckets": (1, 2, 4)}), max_batch_tokens=budget)
    padded = []
    run_batch, score = bounded._run_batch, bounded._score

    def spy_run_batch(state, ps, params):
        padded.append(bounded._padded(range(len(ps)), [len(p) for p in ps]))
        return run_batch(state, ps, params)

    def spy_score(state, tokens, *rest):
        padded.append(tokens.size)
        return score(state, tokens, *rest)

    monkeypatch.setattr(bounded, "_run_batch", spy_run_batch)
    monkeypatch.setattr(bounded, "_score", spy_score)
    params = dataclasses.replace(GREEDY, max_new_tokens=8)
    for got, want in zip(bounded.generate(prompts, params), sampler.generate(prompts, params), strict=True):
        assert got.token_ids == want.token_ids
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert padded == [64, 64, 64]
    conts = [[5, 17, 3]] * len(prompts)
    np.testing.assert_allclose(bounded.score(prompts, conts), sampler.score(prompts, conts), atol=1e-5)
    assert padded == [64] * 6
    alone = Sampler(model, tokenizer, **BUCKETS, max_batch_tokens=1)  # below any prompt: each goes alone
    assert [c.token_ids for c in alone.generate(prompts[:2], params)] == [
        c.token_ids for c in sampler.generate(prompts[:2], params)
    ]
    with pytest.raises(ValueError, match="max_batch_tokens"):
        Sampler(model, tokenizer, **BUCKETS, max_batch_tokens=0)
