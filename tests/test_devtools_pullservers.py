"""devtools.pullservers' generic loopback server for hand-written request handlers."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from devtools.pullservers import serve_handler


class _Echo(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_serve_handler_answers_on_loopback_and_frees_the_port() -> None:
    with serve_handler(_Echo) as address:
        host, port = address.split(":")
        assert host == "127.0.0.1"
        r = httpx.post(f"http://{address}/anything", content=b"ping", timeout=5)
        assert (r.status_code, r.content) == (201, b"ping")
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", int(port)))


def test_serve_handler_stops_when_the_block_raises() -> None:
    with pytest.raises(KeyError), serve_handler(_Echo) as address:
        raise KeyError(address)
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", int(address.split(":")[1])))
