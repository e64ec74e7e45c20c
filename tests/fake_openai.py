"""A local test server that plays an OpenAI-compatible chat endpoint, named as what it is.

``FakeOpenAIServer`` is not vLLM and not a hosted API: a stdlib HTTP server on 127.0.0.1 that
answers any POST from a script of steps (status, delay, reply body, headers, or a dropped
connection), so each failure mode (429 with Retry-After, 5xx, a hang, a dropped connection, a bad
key) is produced on purpose. ``reply_with`` builds a 200 reply whose message is a given text.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@dataclass
class Step:
    """One scripted answer: ``reply`` defaults to ``OK`` for 200 and an OpenAI-style error otherwise;
    ``drop`` closes the connection without answering."""

    status: int = 200
    delay: float = 0.0
    reply: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False


class FakeOpenAIServer:
    """Local test server: step i of ``script`` answers request i (a ``Step``, or a (status, delay_s)
    pair); after the script, every request gets ``default`` (200 with ``OK``). Records each
    request's path, headers and JSON body. ``port``: 0 picks a free one; a given one plays a server
    restarted where a client already points."""

    def __init__(
        self, script: list[Step | tuple[int, float]] | None = None, default: Step | None = None, *, port: int = 0
    ):
        self.script = list(script or [])
        self.default = default or Step()
        self.requests: list[tuple[dict[str, str], dict]] = []
        self.paths: list[str] = []
        self.concurrent = self.max_concurrent = 0
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake._lock:
                    fake.requests.append((dict(self.headers), body))
                    fake.paths.append(self.path)
                    step = fake.script.pop(0) if fake.script else fake.default
                    step = Step(*step) if isinstance(step, tuple) else step
                    fake.concurrent += 1
                    fake.max_concurrent = max(fake.max_concurrent, fake.concurrent)
                time.sleep(step.delay)
                with fake._lock:
                    fake.concurrent -= 1
                if step.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                status = step.status
                reply = step.reply
                if reply is None:
                    reply = OK if status == 200 else {"error": {"message": f"scripted {status}", "code": status}}
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    for k, v in step.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def reply_with(text: str) -> dict[str, Any]:
    """A plain chat completion whose message is ``text`` (no token ids: a text-only provider's reply)."""
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
