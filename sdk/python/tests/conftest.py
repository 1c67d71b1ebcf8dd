"""The suite runs against a real stack that scripts/sdk-test starts: the API at
AGENTFLEET_SDK_TEST_URL, a tenant's key in AGENTFLEET_SDK_TEST_KEY, a tenant limited to one
active run in AGENTFLEET_SDK_TEST_LIMITED_KEY, the scripted model as AGENTFLEET_SDK_TEST_MODEL.
The model plays the script a run's input carries (tests/src/mock_llm.rs); the tools and the
webhook receiver are this process's own HTTP server."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentfleet import Client


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run the suite with scripts/sdk-test", returncode=2)
    return value


@pytest.fixture(scope="session")
def api_url() -> str:
    return _env("AGENTFLEET_SDK_TEST_URL")


@pytest.fixture(scope="session")
def model() -> str:
    return _env("AGENTFLEET_SDK_TEST_MODEL")


@pytest.fixture(scope="session")
def api_key() -> str:
    return _env("AGENTFLEET_SDK_TEST_KEY")


@pytest.fixture
def client(api_url, api_key):
    with Client(api_key=api_key, base_url=api_url) as c:
        yield c


@pytest.fixture
def limited_key() -> str:
    return _env("AGENTFLEET_SDK_TEST_LIMITED_KEY")


def script(*turns) -> str:
    """A run's input that scripts the model's answers, one turn per model call."""
    return json.dumps({"mock_script": list(turns)})


def wait_for(what: str, timeout: float, probe):
    """Polls ``probe`` until it returns something truthy; fails naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Receiver:
    """Tools and a webhook receiver: records every POST (path, headers, raw body) and answers
    `{"ok": true, "arguments": ...}`."""

    def __init__(self):
        self.requests: list = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                try:
                    arguments = json.loads(body).get("arguments")
                except ValueError:
                    arguments = None
                answer = json.dumps({"ok": True, "arguments": arguments}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def posts(self, path: str) -> list:
        return [r for r in self.requests if r[0] == path]

    def close(self):
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


class CutProxy:
    """A TCP proxy to the API whose ``cut()`` breaks every connection open through it."""

    def __init__(self, target_port: int):
        self.connections = 0
        self.refused = 0
        self._refuse = 0
        self._target = ("127.0.0.1", target_port)
        self._open: list = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def refuse_next(self, n: int):
        """The next ``n`` connections get a 503 ``unavailable`` with ``Retry-After: 1``, as an
        API replica that cannot reach its services answers."""
        with self._lock:
            self._refuse = n

    def _accept(self):
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse, self._refuse = self._refuse > 0, max(0, self._refuse - 1)
            if refuse:
                self.refused += 1
                threading.Thread(target=self._refuse_one, args=(downstream,), daemon=True).start()
                continue
            upstream = socket.create_connection(self._target)
            with self._lock:
                self.connections += 1
                self._open += [downstream, upstream]
            threading.Thread(target=self._pump, args=(downstream, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream), daemon=True).start()

    @staticmethod
    def _refuse_one(conn):
        body = b'{"error": {"code": "unavailable", "message": "a backing service cannot be reached"}}'
        head = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
        try:
            conn.recv(65536)  # the request's head
            conn.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        except OSError:
            pass
        conn.close()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.cut()
        self._listener.close()


@pytest.fixture
def cut_proxy(api_url):
    proxy = CutProxy(int(api_url.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()
