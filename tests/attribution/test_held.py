"""The format-held GRM: the flag is the model's choice between " true" and " false" after "FLAG:", the hint its own
continuation after "FLAG: true\\nHINT:", and the reply always parses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fake_openai import FakeOpenAIServer, Step

from porch_jax.attribution.grm import AttributionUnit, grm_request, parse_reply
from porch_jax.attribution.held import FLAG_OPENING, HINT_OPENING, HeldGRM, SamplerReader, ServedReader
from porch_jax.backends import BackendError, Sampling
from porch_jax.backends.completions import CompletionsClient
from porch_jax.backends.openai_chat import OpenAIChatBackend
from porch_jax.protocol.render import prompt_ids

UNIT = AttributionUnit(
    ({"role": "system", "content": "You orchestrate."}, {"role": "user", "content": "Find the phone of Ana Kaya."}),
    '<tool_call>{"name": "delegate", "arguments": {"subgoal": "find phone"}}</tool_call>',
    (),
    "submit: the context lacks 'phone of Ana Kaya'",
)


class Fixed:
    """A reader with given flag log-probabilities, recording what it was asked."""

    def __init__(self, true_lp: float, false_lp: float, hint: str = " add the phone to the context"):
        self.lps, self.hint, self.asked = [true_lp, false_lp], hint, []

    async def logprobs(self, prompt, continuations):
        self.asked.append(("logprobs", prompt, continuations))
        return self.lps

    async def complete(self, prompt, sampling):
        self.asked.append(("complete", prompt, sampling))
        return self.hint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler
    from porch_jax.models.tiny import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=1)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return Sampler(from_pretrained(folder), tokenizer, max_len=1024, prompt_buckets=(768,)), tokenizer


def test_the_flag_is_the_higher_choice_and_only_a_flag_asks_for_a_hint(tiny):
    _, tokenizer = tiny
    request = grm_request(UNIT, Sampling(temperature=0.0, max_tokens=24))
    base = prompt_ids(tokenizer, request.messages)
    no = Fixed(-3.0, -1.0)
    reply = asyncio.run(HeldGRM(no, tokenizer).chat(request))
    assert parse_reply(reply.text).attributable is False and [a[0] for a in no.asked] == ["logprobs"]
    assert no.asked[0][1] == base + tokenizer.encode(FLAG_OPENING, add_special_tokens=False)
    assert [tokenizer.decode(c) for c in no.asked[0][2]] == [" true", " false"]
    yes = Fixed(-0.5, -2.0)
    reply = asyncio.run(HeldGRM(yes, tokenizer).chat(request))
    assert parse_reply(reply.text).hint == "add the phone to the context" and "true -0.5000" in reply.reasoning
    kind, prompt, sampling = yes.asked[1]
    assert kind == "complete" and prompt == base + tokenizer.encode(HINT_OPENING, add_special_tokens=False)
    assert "\nFLAG" in sampling.stop and sampling.max_tokens == 24


def test_with_our_sampler_the_flag_follows_the_models_own_logprobs(tiny):
    sampler, tokenizer = tiny
    request = grm_request(UNIT, Sampling(temperature=0.0, max_tokens=16))
    reader = SamplerReader(sampler)
    reply = asyncio.run(HeldGRM(reader, tokenizer).chat(request))
    judged = parse_reply(reply.text)  # the format holds whatever a random model says
    opening = prompt_ids(tokenizer, request.messages) + tokenizer.encode(FLAG_OPENING, add_special_tokens=False)
    grm = HeldGRM(reader, tokenizer)
    true_lp, false_lp = sampler.score([opening, opening], grm.choices)
    assert judged.attributable == (true_lp > false_lp)


def test_a_served_reader_sums_the_prompt_logprobs_of_each_choice():
    """A local test server playing vLLM's /v1/completions with prompt_logprobs (each token's own logprob)."""
    prompt, choices = [5, 6, 7], [[8], [9, 10]]

    def scored(ids, lps):
        return {"choices": [{"text": "", "prompt_logprobs": [None] + [{str(t): {"logprob": lp}} for t, lp in zip(ids[1:], lps, strict=True)]}]}  # fmt: skip

    server = FakeOpenAIServer(
        [
            Step(reply=scored(prompt + choices[0], [-1.0, -1.0, -0.25])),
            Step(reply=scored(prompt + choices[1], [-1.0, -1.0, -0.5, -0.5])),
            Step(reply={"choices": [{"text": " set budget to 7"}]}),
        ]
    )
    try:
        reader = ServedReader(CompletionsClient(OpenAIChatBackend(server.url, "base", api_key="k-secret")))
        assert asyncio.run(reader.logprobs(prompt, choices)) == [-0.25, -1.0]
        assert asyncio.run(reader.complete(prompt, Sampling(max_tokens=8, stop=("\nFLAG",)))) == " set budget to 7"
    finally:
        server.close()
    bodies = [body for _, body in server.requests]
    assert bodies[0]["prompt"] == prompt + choices[0] and bodies[0]["prompt_logprobs"] == 0
    assert bodies[2]["stop"] == ["\nFLAG"] and server.paths == ["/v1/completions"] * 3
    assert server.requests[0][0]["Authorization"] == "Bearer k-secret"


def test_served_completions_are_retried_as_chat_is():
    """/v1/completions goes through the chat backend's pool: a 429 with Retry-After and a dropped connection are
    retried on it, and a refused key fails at once, naming its variable and never the key."""
    lps = {"choices": [{"text": "", "prompt_logprobs": [None, {"6": {"logprob": -0.5}}]}]}
    flaky = FakeOpenAIServer([Step(status=429, headers={"Retry-After": "0"}), Step(drop=True)], default=Step(reply=lps))
    refused = FakeOpenAIServer(default=Step(status=401, reply={"error": {"message": "bad key k-secret"}}))
    try:
        pool = OpenAIChatBackend(flaky.url, "base", api_key="k-secret", backoff_s=0.0, cooldown_s=0.0, seed=0)
        assert asyncio.run(CompletionsClient(pool).prompt_logprobs([5, 6])) == [-0.5]
        assert pool.retries == 2 and len(flaky.paths) == 3 and set(flaky.paths) == {"/v1/completions"}
        keyed = CompletionsClient(OpenAIChatBackend(refused.url, "base", api_key="k-secret", api_key_env="GRM_KEY"))
        with pytest.raises(BackendError, match=r"GRM_KEY") as e:
            asyncio.run(keyed.prompt_logprobs([5, 6]))
        assert "k-secret" not in str(e.value) and len(refused.paths) == 1  # refused at once, not retried
    finally:
        flaky.close()
        refused.close()


def test_the_hint_starts_from_the_keys_its_flag_was_scored_with(tiny):
    """With a prefix cache (the experiment's held GRM) scoring the flag keeps the prompt's keys and values, and the
    hint after "FLAG: true\\nHINT:" prefills only what it adds: same flag log-probabilities, same hint."""
    from porch_jax.models.sampler import Sampler

    sampler, tokenizer = tiny
    reusing = Sampler(sampler.model, tokenizer, max_len=1024, prompt_buckets=(768,), prefix_cache_bytes=2**26)
    grm = HeldGRM(SamplerReader(sampler), tokenizer)
    base = prompt_ids(tokenizer, grm_request(UNIT, Sampling()).messages)
    sampling = Sampling(temperature=0.0, max_tokens=16)

    async def flag_then_hint(reader):
        return await reader.logprobs(base + grm.flag_opening, grm.choices), await reader.complete(
            base + grm.hint_opening, sampling
        )

    (got_flag, got_hint), (want_flag, want_hint) = (
        asyncio.run(flag_then_hint(SamplerReader(s))) for s in (reusing, sampler)
    )
    np.testing.assert_allclose(got_flag, want_flag, atol=1e-5)
    assert got_hint == want_hint
    assert reusing.prefixes.stats()["reused_tokens"] >= len(base)


def test_concurrent_requests_share_one_sampler_call():
    """The attribution job asks many decisions at once: the reader scores (and completes) what waits together in
    one sampler call, each caller getting its own rows back."""

    class Recorder:
        def __init__(self):
            self.calls = []

        def next_token_logprobs(self, prompts, tokens):  # the flag's one-token choices: one row per prompt
            self.calls.append(("score", len(prompts)))
            return [[float(p[0] * 10 + t) for t in tokens] for p in prompts]

        def generate(self, prompts, params):
            self.calls.append(("generate", len(prompts)))
            return [type("C", (), {"text": f" hint {p[0]}"})() for p in prompts]

    sampler = Recorder()
    reader = SamplerReader(sampler)

    async def many():
        scored = await asyncio.gather(*(reader.logprobs([i], [[1], [2]]) for i in range(6)))
        hints = await asyncio.gather(*(reader.complete([i], Sampling(max_tokens=4)) for i in range(6)))
        return scored, hints

    scored, hints = asyncio.run(many())
    assert scored == [[10.0 * i + 1, 10.0 * i + 2] for i in range(6)] and hints == [f" hint {i}" for i in range(6)]
    assert len(sampler.calls) < 12 and sum(n for kind, n in sampler.calls if kind == "score") == 6, sampler.calls
