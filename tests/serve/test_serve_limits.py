"""The server's limits on what a client may hold (docs/serving.md#limits-and-timeouts), over raw
sockets against `launch/serve.py` with short timeouts: a request head that never completes
and a body that stalls are cut off, a client gone mid-body is counted as cancelled without a
traceback, and SIGTERM ends within `serve.drain_timeout` while a client holds half a body."""
import json
import socket
import time
import urllib.request

import pytest

from orl_jax.serve.process import ServerProcess
from tests.support.serve import MODEL, README_SERVE, tiny_problems

# the drain timeout is shorter than the body timeout: a stalled body is ended by the drain
LIMITS = ["--config.serve.header_timeout=1", "--config.serve.body_timeout=3",
          "--config.serve.idle_timeout=1", "--config.serve.drain_timeout=1"]
HALF = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{\"model\": ")


@pytest.fixture(scope="module")
def server():
  with ServerProcess(README_SERVE + LIMITS) as s:
    yield s


def _connect(server) -> socket.socket:
  host, port = server.url.split("//")[1].split(":")
  return socket.create_connection((host, int(port)), timeout=30)


def _read_all(sock: socket.socket) -> bytes:
  """What the server sends until it closes the connection."""
  out = b""
  while chunk := sock.recv(4096):
    out += chunk
  return out


def _cancelled(server) -> float:
  with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
    for line in r.read().decode().splitlines():
      if line.startswith('orl_requests_total{outcome="cancelled"}'):
        return float(line.split()[-1])
  return 0.0


def test_a_head_that_never_completes_is_closed_after_the_header_timeout(server):
  sock = _connect(server)
  sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")     # no blank line: no end
  start = time.monotonic()
  assert _read_all(sock) == b""
  assert 0.5 < time.monotonic() - start < 10


def test_a_stalled_body_gets_408_after_the_body_timeout(server):
  sock = _connect(server)
  sock.sendall(HALF)
  start = time.monotonic()
  reply = _read_all(sock)
  assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
  assert b"serve.body_timeout" in reply and 2 < time.monotonic() - start < 20


def test_a_client_gone_mid_body_is_cancelled_without_a_traceback(server):
  before = _cancelled(server)
  sock = _connect(server)
  sock.sendall(HALF)
  time.sleep(0.2)
  sock.close()
  deadline = time.monotonic() + 20
  while _cancelled(server) == before and time.monotonic() < deadline:
    time.sleep(0.1)
  assert _cancelled(server) == before + 1
  assert "Traceback" not in server.output()
  body = json.dumps({"model": MODEL, "prompt": tiny_problems()[0].prompt}).encode()
  req = urllib.request.Request(server.url + "/v1/completions", data=body, method="POST")
  with urllib.request.urlopen(req, timeout=60) as r:
    assert r.status == 200 and json.load(r)["choices"][0]["text"]


def test_sigterm_ends_within_the_drain_timeout_while_a_client_holds_half_a_body(server):
  """Runs last: it stops the module's server."""
  sock = _connect(server)
  sock.sendall(HALF)
  time.sleep(0.2)
  start = time.monotonic()
  server._proc.send_signal(15)
  status = server.wait_exit(30)
  elapsed = time.monotonic() - start
  assert status == 0, server.output()
  assert elapsed < 3, elapsed          # the drain (1 s), not the body timeout (3 s), ended it
  assert "Traceback" not in server.output()
  sock.close()
