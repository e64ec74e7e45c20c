"""The OpenAI-compatible backend's retry, timeout, failover, provider and parsing logic against a
local test server (tests/fake_openai.py, which plays the endpoint and its faults).

Hosted providers' reply formats come from tests/fixtures/providers/ (see its README). The real vLLM
server is exercised in tests/serving/test_vllm_server.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import OK, FakeOpenAIServer, Step

from porch_jax.backends import BackendError, ChatRequest, OpenAIChatBackend, Sampling
from porch_jax.backends.openai_chat import VLLMBackend, parse_chat_response, retry_after_seconds
from porch_jax.backends.providers import PROVIDERS
from porch_jax.backends.spec import EndpointSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "providers"


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    yield server
    server.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def req(**sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "hello"}], sampling=Sampling(**sampling))


def backend(urls, **kw) -> VLLMBackend:
    kw = {"timeout_s": 2.0, "max_retries": 3, "backoff_s": 0.01, "seed": 0, **kw}
    return VLLMBackend(urls, "tiny", api_key="k", **kw)


async def chat(b: VLLMBackend, request: ChatRequest):
    async with b:
        return await b.chat(request)


def test_retries_429_and_500_then_returns_ids_and_logprobs(fake):
    fake.script = [(429, 0.0), (500, 0.0)]
    b = backend(fake.url)
    result = asyncio.run(chat(b, req(max_tokens=2, seed=5, stop=("x",))))
    assert (result.text, result.token_ids, result.logprobs) == (" fold fold", [668, 668], [-6.4, -5.9])
    assert (result.prompt_tokens, result.completion_tokens, result.finish_reason) == (13, 2, "length")
    assert len(fake.requests) == 3 and b.retries == 2
    headers, body = fake.requests[-1]
    assert headers["Authorization"] == "Bearer k"
    assert body["return_token_ids"] is True and body["logprobs"] is True and body["n"] == 1
    assert (body["model"], body["seed"], body["stop"], body["max_tokens"]) == ("tiny", 5, ["x"], 2)


def test_bad_request_is_not_retried(fake):
    fake.script = [(400, 0.0)]
    with pytest.raises(BackendError, match="HTTP 400: scripted 400") as info:
        asyncio.run(chat(backend(fake.url), req()))
    assert not info.value.retryable and len(fake.requests) == 1


def test_gives_up_after_max_retries(fake):
    fake.script = [(503, 0.0)] * 10
    with pytest.raises(BackendError, match="on all 3 attempts"):
        asyncio.run(chat(backend(fake.url, max_retries=2), req()))
    assert len(fake.requests) == 3


def test_hung_attempt_times_out_and_is_retried(fake):
    fake.script = [(200, 3.0)]  # past the 0.5 s timeout
    t0 = time.perf_counter()
    result = asyncio.run(chat(backend(fake.url, timeout_s=0.5), req()))
    assert result.token_ids == [668, 668] and len(fake.requests) == 2
    assert time.perf_counter() - t0 < 2.5


def test_all_attempts_timing_out_raise(fake):
    fake.script = [(200, 3.0)] * 3
    with pytest.raises(BackendError, match="timed out on all 2 attempts"):
        asyncio.run(chat(backend(fake.url, timeout_s=0.3, max_retries=1), req()))


def test_refused_connection_fails_over_and_cools_down(fake):
    dead = closed_port_url()
    b = backend([dead, fake.url], cooldown_s=60.0)

    async def run():
        async with b:
            return [await b.chat(req()) for _ in range(4)]

    results = asyncio.run(run())
    assert all(r.token_ids == [668, 668] for r in results)
    stats = {s.url: s for s in b.servers}
    assert stats[dead].failures == 1 and stats[dead].requests == 1  # cooling down after one refusal
    assert stats[fake.url].requests == 4


def test_a_dead_server_is_probed_after_its_cooldown_and_rejoins_when_restarted(fake):
    dead = closed_port_url()
    b = backend([dead, fake.url], cooldown_s=0.3)
    stats = {s.url: s for s in b.servers}

    async def calls(n: int) -> None:
        async with b:
            for _ in range(n):
                assert (await b.chat(req())).token_ids == [668, 668]

    asyncio.run(calls(4))
    assert (stats[dead].failures, stats[dead].answered) == (1, 0)  # refused once, then out of rotation
    time.sleep(0.4)
    asyncio.run(calls(2))  # after the cooldown the rotation tries it again: refused, and the call moves on
    assert (stats[dead].failures, stats[dead].answered) == (2, 0)
    restarted = FakeOpenAIServer(port=int(dead.rsplit(":", 1)[1]))  # the server back on the same port
    try:
        time.sleep(0.4)
        asyncio.run(calls(2))
        assert stats[dead].answered >= 1 and len(restarted.requests) == stats[dead].answered
        assert stats[dead].failures == 2
    finally:
        restarted.close()


def test_a_stalled_server_times_out_leaves_the_rotation_and_the_pool_moves_on():
    stalled, healthy = FakeOpenAIServer(default=Step(delay=5.0)), FakeOpenAIServer()
    try:
        b = backend([stalled.url, healthy.url], timeout_s=0.4, cooldown_s=60.0)

        async def run():
            async with b:
                return await asyncio.gather(*(b.chat(req()) for _ in range(6)))

        t0 = time.perf_counter()
        results = asyncio.run(run())
        wall = time.perf_counter() - t0
        stats = {s.url: s for s in b.servers}
        assert all(r.token_ids == [668, 668] for r in results) and wall < 3.0
        assert stats[stalled.url].answered == 0 and stats[stalled.url].timeouts == stats[stalled.url].requests >= 1
        assert stats[healthy.url].answered == 6 and b.retries == stats[stalled.url].timeouts
        assert stats[stalled.url].down_until > time.monotonic() + 50  # out of rotation for its cooldown
    finally:
        stalled.close()
        healthy.close()


def test_concurrent_requests_spread_over_servers():
    servers = [FakeOpenAIServer([(200, 0.2)] * 8) for _ in range(2)]
    try:
        b = backend([s.url for s in servers])

        async def run():
            async with b:
                return await asyncio.gather(*(b.chat(req()) for _ in range(8)))

        results = asyncio.run(run())
        assert len(results) == 8
        assert [len(s.requests) for s in servers] == [4, 4]
        assert all(s.inflight == 0 for s in b.servers)
    finally:
        for s in servers:
            s.close()


def test_tools_are_rendered_without_a_server_side_parser(fake):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=[tool])
    asyncio.run(chat(backend(fake.url), request))
    body = fake.requests[0][1]
    assert body["tools"] == [tool] and body["tool_choice"] == "none"


def test_tools_in_prompt_moves_the_schemas_into_the_system_message(fake):
    tool = {"type": "function", "function": {"name": "lookup", "description": "find a page", "parameters": {}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    asyncio.run(chat(backend(fake.url, tools_in_prompt=True), ChatRequest(messages=messages, tools=[tool])))
    body = fake.requests[0][1]
    assert "tools" not in body and "tool_choice" not in body
    system = body["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n")
    assert json.dumps(tool) in system["content"] and "<tool_call>" in system["content"]
    assert body["messages"][1:] == messages[1:] and messages[0]["content"] == "Be brief."  # the request is not mutated


def test_endpoint_flags_round_trip_booleans():
    import argparse

    from porch_jax.backends.spec import EndpointSpec, add_endpoint_flags, endpoint_from_flags

    for value in (True, False):
        spec = EndpointSpec("m", ("http://h:1",), tools_in_prompt=value)
        parser = argparse.ArgumentParser()
        add_endpoint_flags(parser, "executor")
        assert endpoint_from_flags(vars(parser.parse_args(spec.flags("executor"))), "executor") == spec
    assert EndpointSpec("m", ("http://h:1",), tools_in_prompt=True).backend().tools_in_prompt


def test_n_above_one_and_malformed_replies_are_errors():
    with pytest.raises(BackendError, match="n=2"):
        asyncio.run(backend("http://127.0.0.1:9").chat(req(n=2)))
    with pytest.raises(BackendError, match="malformed chat completion"):
        parse_chat_response({"choices": [{"text": "x"}]})
    with pytest.raises(BackendError, match="no token_ids"):
        parse_chat_response({"choices": [{"message": {"content": "x"}}]}, provider="vllm")
    bad = json.loads(json.dumps(OK))
    bad["choices"][0]["logprobs"]["content"].pop()
    with pytest.raises(BackendError, match="2 token ids but 1 logprobs"):
        parse_chat_response(bad)


def test_client_survives_a_new_event_loop(fake):
    b = backend(fake.url)
    assert asyncio.run(b.chat(req())).token_ids == [668, 668]
    assert asyncio.run(b.chat(req())).token_ids == [668, 668]  # a second asyncio.run: a fresh client


# ---- providers: quirks as data, keys from the environment, Retry-After, dropped connections ----------------


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def provider_backend(url: str, name: str, **kw) -> OpenAIChatBackend:
    kw = {"timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01, "seed": 0, "api_key": "test-key-0", **kw}
    return OpenAIChatBackend(url, "m", provider=name, **kw)


def sent_body(fake: FakeOpenAIServer, name: str, **sampling) -> dict:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    request = ChatRequest([{"role": "user", "content": "hi"}], [tool], Sampling(**sampling))
    asyncio.run(chat(provider_backend(fake.url, name), request))
    return fake.requests[-1][1]


def test_vllm_asks_for_its_extras_and_plain_mode_for_standard_fields_only(fake):
    extras = sent_body(fake, "vllm", max_tokens=8, top_k=5, seed=1)
    assert extras["return_token_ids"] is True and extras["return_prompt_text"] is True and extras["top_k"] == 5
    plain = sent_body(fake, "openai_compatible", max_tokens=8, top_k=5, seed=1)
    assert not {"return_token_ids", "return_prompt_text", "top_k"} & set(plain)
    assert (plain["max_tokens"], plain["seed"], plain["logprobs"], plain["tool_choice"]) == (8, 1, True, "none")
    assert fake.paths == ["/v1/chat/completions"] * 2


@pytest.mark.parametrize(
    ("name", "present", "absent"),
    [
        ("openai", {"max_completion_tokens", "temperature", "top_p", "stop", "seed", "logprobs"}, {"max_tokens"}),
        (
            "openai_reasoning",
            {"max_completion_tokens"},
            {"max_tokens", "temperature", "top_p", "stop", "logprobs", "return_token_ids"},
        ),
        ("gemini", {"max_tokens", "temperature", "stop"}, {"seed", "logprobs", "max_completion_tokens"}),
        ("deepseek", {"max_tokens", "temperature", "logprobs", "stop"}, {"seed", "return_token_ids"}),
        ("deepseek_reasoner", {"max_tokens"}, {"temperature", "top_p", "logprobs", "seed"}),
        ("sglang", {"max_tokens", "top_k", "seed"}, {"return_token_ids", "return_prompt_text"}),
    ],
)
def test_each_providers_request_holds_only_the_fields_it_takes(fake, name, present, absent):
    body = sent_body(fake, name, max_tokens=8, top_k=5, seed=1, stop=("x",), temperature=0.7)
    assert present <= set(body), present - set(body)
    assert not absent & set(body), absent & set(body)


@pytest.mark.parametrize("name", ["vllm", "sglang", "openai", "deepseek"])
def test_the_thinking_switch_reaches_templates_only_where_the_server_renders_them(fake, name):
    off = sent_body(fake, name, max_tokens=8, thinking=False)
    default = sent_body(fake, name, max_tokens=8)
    assert "chat_template_kwargs" not in default  # None: the template's own default, nothing sent
    if name in ("vllm", "sglang"):
        assert off["chat_template_kwargs"] == {"enable_thinking": False}
    else:  # a hosted API renders no template of ours: the switch is not a field it takes
        assert "chat_template_kwargs" not in off


def test_sampling_refuses_values_no_server_takes():
    for bad, field in ((dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"),
                       (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k")):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            Sampling(**bad)
    assert Sampling(thinking=True).template_kwargs == {"enable_thinking": True} and Sampling().template_kwargs == {}


def test_hosted_providers_default_to_their_endpoint_and_key_variable(monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "g-secret")
    b = OpenAIChatBackend(None, "gemini-2.5-flash", provider="gemini")
    assert b.servers[0].url == PROVIDERS["gemini"].base_url and b.api_key == "g-secret"
    assert b.api_key_env == "GEMINI_API_KEY"
    assert PROVIDERS["openai"].chat_path == "/chat/completions"


def test_fixture_replies_parse_without_token_ids_as_text_only():
    openai = parse_chat_response(fixture("openai"), provider="openai")
    assert (openai.text, openai.token_ids, openai.token_source) == ("Paris", [], "none")
    assert openai.logprobs == [-0.0012] and (openai.prompt_tokens, openai.completion_tokens) == (21, 1)
    reasoning = parse_chat_response(fixture("openai_reasoning"), provider="openai_reasoning")
    assert reasoning.text.startswith("<tool_call>") and reasoning.logprobs == [] and reasoning.completion_tokens == 210
    gemini = parse_chat_response(fixture("gemini"), provider="gemini")
    assert gemini.text == "The capital of France is Paris." and gemini.token_source == "none"
    deepseek = parse_chat_response(fixture("deepseek_reasoner"), provider="deepseek_reasoner")
    assert deepseek.text == "Paris" and deepseek.reasoning.startswith("The user asks")


def test_vllm_reply_keeps_server_ids_prompt_ids_and_rendered_prompt():
    reply = json.loads(json.dumps(OK)) | {"prompt_token_ids": [1, 2, 3], "prompt_text": "<|im_start|>user\nhi"}
    result = parse_chat_response(reply, provider="vllm")
    assert (result.token_source, result.prompt_token_ids, result.prompt_text) == (
        "server",
        [1, 2, 3],
        reply["prompt_text"],
    )
    with pytest.raises(BackendError, match="no token_ids.*needs provider='openai_compatible'"):  # declared, not sent
        parse_chat_response(fixture("openai"), provider="vllm")


def test_default_arguments_speak_the_standard_format(fake):
    """No provider named: standard fields asked for, a standard reply (the OpenAI fixture) read as text only."""
    fake.script = [Step(429, headers={"Retry-After": "1"})]
    fake.default = Step(reply=fixture("openai"))
    b = OpenAIChatBackend(fake.url, "m")
    result = asyncio.run(chat(b, req()))
    assert (result.text, result.token_source, b.retries) == ("Paris", "none", 1)
    assert not {"return_token_ids", "return_prompt_text"} & set(fake.requests[-1][1])
    assert EndpointSpec("m", (fake.url,)).backend().provider.name == "openai_compatible"


def test_key_comes_from_the_named_variable_and_a_missing_one_is_named(fake, monkeypatch):
    monkeypatch.setenv("PORCH_TEST_KEY", "sk-live-123")
    b = OpenAIChatBackend(fake.url, "m", provider="openai", api_key_env="PORCH_TEST_KEY", backoff_s=0.01)
    fake.default = Step(reply=fixture("openai"))
    asyncio.run(chat(b, req()))
    headers, body = fake.requests[-1]
    assert headers["Authorization"] == "Bearer sk-live-123" and "sk-live-123" not in json.dumps(body)
    monkeypatch.delenv("PORCH_TEST_KEY")
    with pytest.raises(BackendError, match=r"\$PORCH_TEST_KEY is not set"):
        OpenAIChatBackend(fake.url, "m", provider="openai", api_key_env="PORCH_TEST_KEY")


def test_bad_key_fails_at_once_naming_the_variable_never_the_key(fake, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-very-secret")
    echo = [{"error": {"code": 401, "message": "API key AIza-very-secret not valid.", "status": "UNAUTHENTICATED"}}]
    fake.script = [Step(401, reply=echo)]
    b = OpenAIChatBackend(fake.url, "m", provider="gemini", backoff_s=0.01)
    with pytest.raises(BackendError) as info:
        asyncio.run(chat(b, req()))
    message = str(info.value)
    assert "$GEMINI_API_KEY" in message and "authentication failed" in message and "not valid" in message
    assert "AIza-very-secret" not in message and "[redacted]" in message
    assert not info.value.retryable and len(fake.requests) == 1
    fake.script = [Step(400, reply=fixture("gemini_error"))]
    with pytest.raises(BackendError, match="API key not valid"):  # Gemini's error body is a list
        asyncio.run(chat(b, req()))


def test_429_retry_after_is_honoured(fake):
    fake.script = [Step(429, headers={"Retry-After": "1"})]
    b = provider_backend(fake.url, "openai", backoff_s=0.001, max_backoff_s=0.01)
    fake.default = Step(reply=fixture("openai"))
    t0 = time.perf_counter()
    assert asyncio.run(chat(b, req())).text == "Paris"
    assert time.perf_counter() - t0 >= 0.9 and b.retries == 1


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= retry_after_seconds(later) <= 31


def test_dropped_connection_is_retried(fake):
    fake.script = [Step(drop=True), Step(503)]
    b = provider_backend(fake.url, "vllm")
    assert asyncio.run(chat(b, req())).token_ids == [668, 668] and b.retries == 2


def test_unknown_provider_is_named():
    with pytest.raises(BackendError, match="unknown provider 'opneai'; known: .*openai"):
        OpenAIChatBackend("http://127.0.0.1:9", "m", provider="opneai")


def test_no_key_appears_in_retry_exhaustion_errors(fake, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-secret-9")
    fake.default = Step(503, reply={"error": {"message": "overloaded for key ds-secret-9"}})
    b = OpenAIChatBackend(fake.url, "m", provider="deepseek", max_retries=1, backoff_s=0.01)
    with pytest.raises(BackendError) as info:
        asyncio.run(chat(b, req()))
    chain, e = [], info.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert "ds-secret-9" not in " ".join(chain) and os.environ["DEEPSEEK_API_KEY"] == "ds-secret-9"
