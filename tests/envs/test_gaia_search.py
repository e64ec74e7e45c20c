"""Search providers by name, and the Serper provider against a local test server playing Serper's request
and response format (POST JSON {"q", "num"}, header X-API-KEY, results under "organic"): hits, an HTTP
500, a missing key, and the key never appearing in an error."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from porch_jax.envs.gaia import (
    CorpusFetcher,
    CorpusSearch,
    GaiaEnvironment,
    Page,
    SearchHit,
    SerperSearch,
    search_provider,
)

KEY = "test-key-0123456789"
ORGANIC = [
    {"title": "Greenland", "link": "https://wiki.example/Greenland", "snippet": "Its capital is Nuuk.", "position": 1},
    {"title": "Nuuk", "link": "https://wiki.example/Nuuk", "snippet": "Nuuk is the capital.", "position": 2},
    {"title": "Iceland", "link": "https://wiki.example/Iceland", "position": 3},  # Serper omits empty snippets
]


class SerperFormatServer(BaseHTTPRequestHandler):
    """A local test server playing google.serper.dev/search; /fail answers 500 and echoes the key it got."""

    requests: list[tuple[str, dict, str]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers.get("X-API-KEY", "")
        self.requests.append((self.path, body, key))
        if self.path == "/fail":
            self._reply(500, {"message": f"internal error for key {key}"})
        elif key != KEY:
            self._reply(403, {"message": "Unauthorized.", "statusCode": 403})
        else:
            organic = ORGANIC[: body["num"]]
            self._reply(200, {"searchParameters": {"q": body["q"], "type": "search"}, "organic": organic})

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet test output
        pass


@pytest.fixture
def serper_url():
    SerperFormatServer.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), SerperFormatServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_serper_sends_its_format_and_reads_organic_results(serper_url, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    hits = SerperSearch(endpoint=f"{serper_url}/search", timeout_s=5).search("capital of Greenland", k=3)
    assert hits == [
        SearchHit("Greenland", "https://wiki.example/Greenland", "Its capital is Nuuk."),
        SearchHit("Nuuk", "https://wiki.example/Nuuk", "Nuuk is the capital."),
        SearchHit("Iceland", "https://wiki.example/Iceland", ""),
    ]
    assert SerperFormatServer.requests == [("/search", {"q": "capital of Greenland", "num": 3}, KEY)]


def test_serper_http_errors_name_the_status_never_the_key(serper_url, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    with pytest.raises(RuntimeError, match="Serper search failed: HTTP 500") as failed:
        SerperSearch(endpoint=f"{serper_url}/fail", timeout_s=5).search("q")
    assert KEY not in str(failed.value) and "internal error for key ***" in str(failed.value)
    env = GaiaEnvironment(SerperSearch(endpoint=f"{serper_url}/fail", timeout_s=5), CorpusFetcher([]))
    observation = env.call_tool(0, "web_search", {"query": "q"})
    assert observation.startswith("error: RuntimeError: Serper search failed: HTTP 500") and KEY not in observation
    monkeypatch.setenv("SERPER_API_KEY", "wrong-key")
    with pytest.raises(RuntimeError, match="HTTP 403"):
        SerperSearch(endpoint=f"{serper_url}/search", timeout_s=5).search("q")


def test_a_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match=r"\$SERPER_API_KEY, which is unset or empty"):
        search_provider("serper")
    monkeypatch.setenv("MY_SERPER_KEY", "")
    with pytest.raises(RuntimeError, match=r"\$MY_SERPER_KEY"):
        SerperSearch(api_key_env="MY_SERPER_KEY")


def test_search_provider_builds_providers_by_name(monkeypatch):
    pages = [Page("https://wiki.example/Nuuk", "Nuuk", "<p>Nuuk is the capital of Greenland.</p>")]
    offline = search_provider("offline", pages)
    assert isinstance(offline, CorpusSearch) and offline.search("capital")[0].url == "https://wiki.example/Nuuk"
    with pytest.raises(ValueError, match="offline search provider searches a corpus"):
        search_provider("offline")
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    assert isinstance(search_provider("serper"), SerperSearch)
    with pytest.raises(ValueError, match="unknown search provider 'bing'"):
        search_provider("bing")
