"""The server's keys and its limits on what a client may hold (docs/serving.md#keys,
docs/serving.md#limits-and-timeouts), against `launch/serve.py` with API keys and short
timeouts: the `openai` client gets 401 without a key and the normal answer with one; over raw
sockets, a request head that never completes and a body that stalls are cut off, a client gone
mid-body is counted as cancelled without a traceback, and SIGTERM ends within
`serve.drain_timeout` while a client holds half a body."""
import json
import os
import socket
import time
import urllib.error
import urllib.request

import openai
import pytest

from orl_jax.serve.process import ServerProcess
from tests.support import serve_fuzz
from tests.support.serve import MODEL, README_SERVE, alone, offline, tiny_problems

# the drain timeout is shorter than the body timeout: a stalled body is ended by the drain
LIMITS = ["--config.serve.header_timeout=1", "--config.serve.body_timeout=3",
          "--config.serve.idle_timeout=1", "--config.serve.drain_timeout=1"]
# keys from the environment (two) and the command line (one); no admin key
KEYS = {"ORL_API_KEYS": "key-one,key-two"}
HALF = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer key-one\r\nContent-Length: 100\r\n\r\n{\"model\": ")


@pytest.fixture(scope="module")
def server():
  with ServerProcess(README_SERVE + LIMITS + ["--api-key=key-three"],
                     env={**os.environ, **KEYS}) as s:
    yield s


def _request(server, path: str, body: dict | None = None, key: str = ""):
  """(status, JSON body) of a GET (no body) or POST, with `key` as its bearer key."""
  headers = {"Content-Type": "application/json"}
  if key:
    headers["Authorization"] = f"Bearer {key}"
  data = None if body is None else json.dumps(body).encode()
  req = urllib.request.Request(server.url + path, data=data, headers=headers)
  try:
    with urllib.request.urlopen(req, timeout=60) as r:
      return r.status, r.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def test_the_openai_client_gets_401_without_a_key_and_the_answer_with_one(server):
  prompt = tiny_problems()[2].prompt
  for wrong in ("", "key-four"):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=wrong or "-", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
      client.completions.create(model=MODEL, prompt=prompt)
    with pytest.raises(openai.AuthenticationError):
      client.models.list()
  for key in ("key-one", "key-two", "key-three"):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
    out = client.completions.create(model=MODEL, prompt=prompt)
    assert out.choices[0].text == alone(offline(), prompt)[0]


def test_a_large_body_without_a_key_gets_its_401_not_a_reset(server):
  """The refused body is read before the answer: a client that sends all of it before it
  reads gets the 401, not a connection reset."""
  body = json.dumps({"model": MODEL, "prompt": "bob " * 200_000}).encode()     # ~800 KB
  for _ in range(3):
    assert serve_fuzz.send(server.url, "POST", "/v1/completions", body) == 401


def test_the_401_bodies_are_openais_and_probes_stay_open(server):
  status, body = _request(server, "/v1/models")
  error = json.loads(body)["error"]
  assert status == 401 and error["code"] is None and error["type"] == "invalid_request_error"
  assert error["message"].startswith("You didn't provide an API key.")
  status, body = _request(server, "/v1/models", key="key-four")
  error = json.loads(body)["error"]
  assert status == 401 and error["code"] == "invalid_api_key" and "key-four" not in body
  assert _request(server, "/health")[0] == 200 and _request(server, "/metrics")[0] == 200
  status, body = _request(server, "/v1/admin/reload", {"path": "assets/tiny_base"},
                          key="key-one")
  assert status == 403 and "admin API is off" in json.loads(body)["error"]["message"]


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
  req = urllib.request.Request(server.url + "/v1/completions", data=body, method="POST",
                               headers={"Authorization": "Bearer key-two"})
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
  # the closing line tells the truth: the held request was cut off, not answered
  assert "drain timeout (1 s, serve.drain_timeout): 1 request(s) cut off; exiting" in \
      server.output(), server.output()
  assert "every request answered" not in server.output()
  sock.close()
