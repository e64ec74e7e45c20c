"""VLLMBackend's retry, timeout, failover and parsing logic against a local test double.

``FakeOpenAIServer`` is a test double, not vLLM: a stdlib HTTP server on 127.0.0.1 that answers
``/v1/chat/completions`` from a script of (status, delay) steps, so each failure mode (429, 500,
a hang, a refused connection) is produced on purpose. The real server is exercised in
tests/serving/test_vllm_server.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from porch_jax.backends import BackendError, ChatRequest, Sampling
from porch_jax.backends.vllm_http import VLLMBackend, parse_chat_response

OK = {
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " fold fold"},
            "finish_reason": "length",
            "token_ids": [668, 668],
            "logprobs": {"content": [{"token": " fold", "logprob": -6.4}, {"token": " fold", "logprob": -5.9}]},
        }
    ],
    "usage": {"prompt_tokens": 13, "completion_tokens": 2, "total_tokens": 15},
}


class FakeOpenAIServer:
    """Test double: step i of ``script`` answers request i with (status, delay_s); after the script,
    every request gets 200 with ``OK``. Records each request's headers and JSON body."""

    def __init__(self, script: list[tuple[int, float]] | None = None):
        self.script = list(script or [])
        self.requests: list[tuple[dict[str, str], dict]] = []
        self.concurrent = self.max_concurrent = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.requests.append((dict(self.headers), body))
                    status, delay = fake.script.pop(0) if fake.script else (200, 0.0)
                    fake.concurrent += 1
                    fake.max_concurrent = max(fake.max_concurrent, fake.concurrent)
                time.sleep(delay)
                with fake._lock:
                    fake.concurrent -= 1
                reply = OK if status == 200 else {"error": {"message": f"scripted {status}", "code": status}}
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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


def test_n_above_one_and_malformed_replies_are_errors():
    with pytest.raises(BackendError, match="n=2"):
        asyncio.run(backend("http://127.0.0.1:9").chat(req(n=2)))
    with pytest.raises(BackendError, match="malformed chat completion"):
        parse_chat_response({"choices": [{"message": {"content": "x"}}]})
    bad = json.loads(json.dumps(OK))
    bad["choices"][0]["logprobs"]["content"].pop()
    with pytest.raises(BackendError, match="2 token ids but 1 logprobs"):
        parse_chat_response(bad)


def test_client_survives_a_new_event_loop(fake):
    b = backend(fake.url)
    assert asyncio.run(b.chat(req())).token_ids == [668, 668]
    assert asyncio.run(b.chat(req())).token_ids == [668, 668]  # a second asyncio.run: a fresh client
