"""Requests for the server's fuzz tests: Hypothesis strategies over the OpenAI request schema
as this server reads it (docs/serving.md#the-api), each field drawn from values that are
right, of the wrong type, out of range or odd (NaN, huge, empty, nested), plus bodies that
are not JSON objects at all and routes and methods that do not exist. Whatever is drawn, the
server owes a 4xx sentence or a 200 (`send`)."""
import json
import socket

from hypothesis import strategies as st

from tests.support.serve import MODEL, tiny_problems

_WORDS = ("bob", "ann", "has", "pens", "he", "sells", "more", "how", "many", "?", ".", "7",
          "hello", "", " ", "\u00e9t\u00e9", "\x00", "<|eos|>", "[MASK]")
_NUMBERS = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 16, 17, 32, 33, -1, 1e400, 2**64, 2**64 - 1, 0.5]))
_ODD = st.one_of(st.none(), st.booleans(), _NUMBERS, st.text(max_size=8),
                 st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(
                     st.text(max_size=3), st.integers(), max_size=2))


def _decoders():
  names = st.sampled_from(["threshold_", "entropy_budget_", "fixed_steps_", "greedy_", ""])
  values = st.one_of(st.sampled_from(["0.9", "1", "0", "1.5", "inf", "-inf", "nan", "1e400",
                                      "1e9", "2", "32", "33", "-1", "0.0", "1_0", " 1", "0x10",
                                      "", "2.5"]),
                     st.floats(allow_nan=True, allow_infinity=True).map(repr))
  return st.one_of(st.builds(lambda a, b: a + b, names, values), _ODD)


def _prompts():
  good = st.sampled_from([p.prompt for p in tiny_problems()[:8]])
  text = st.lists(st.sampled_from(_WORDS), max_size=8).map(" ".join)
  ids = st.lists(st.integers(-2, 300), max_size=6)
  return st.one_of(good, text, ids, st.lists(st.one_of(good, text), max_size=3),
                   st.lists(ids, max_size=3), st.just([[]]), st.just([]), _ODD,
                   st.lists(st.lists(st.lists(st.integers(0, 5), max_size=2), max_size=2),
                            max_size=2))


_RIGHT = {   # values the server must answer (with a good prompt): 200; null is left out
    "model": st.just(MODEL), "n": st.integers(1, 3), "max_tokens": st.integers(1, 32),
    "temperature": st.floats(0, 2), "seed": st.integers(0, 2**64 - 1),
    "stop": st.lists(st.sampled_from(["=", "1", " ", "ab"]), max_size=4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(),
                                                                        st.none())}),
    "decoder": st.one_of(st.floats(0.01, 1).map(lambda t: f"threshold_{t}"),
                         st.floats(0, 5).map(lambda g: f"entropy_budget_{g}"),
                         st.integers(1, 32).map(lambda k: f"fixed_steps_{k}")),
}
_NULLABLE = ("n", "max_tokens", "temperature", "seed", "stop", "stream", "stream_options",
             "decoder")


def _common(draw) -> dict:
  """Fields both endpoints take, each present or not; one body in four has only right values
  (most of those are answered), the others right or odd ones."""
  if draw(st.integers(0, 3)) == 0:
    chosen = draw(st.lists(st.sampled_from(sorted(_RIGHT)), unique=True, max_size=5))
    body = {k: draw(st.one_of(_RIGHT[k], st.none()) if k in _NULLABLE else _RIGHT[k])
            for k in chosen}
    if body.get("stream_options") is not None:
      body["stream"] = True                         # stream_options go with a stream only
    return body | {"prompt": draw(st.sampled_from([p.prompt for p in tiny_problems()[:8]]))}
  fields = {
      "model": st.one_of(st.just(MODEL), _ODD),
      "n": st.one_of(st.integers(-1, 18), _ODD),
      "max_tokens": st.one_of(st.integers(-1, 40), _ODD),
      "temperature": st.one_of(st.floats(-1, 3), _ODD),
      "seed": st.one_of(st.integers(-1, 2**65), _ODD),
      "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=2), max_size=6), _ODD),
      "stream": st.one_of(st.booleans(), _ODD),
      "stream_options": st.one_of(st.just({"include_usage": True}), _ODD),
      "decoder": _decoders(),
      "top_p": _ODD, "logprobs": _ODD, "logit_bias": _ODD, "user": _ODD,
      "colour": _ODD,
  }
  chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=6))
  return {k: draw(fields[k]) for k in chosen}


@st.composite
def completion_bodies(draw) -> dict:
  body = _common(draw)
  body.setdefault("model", MODEL)
  if "prompt" not in body and draw(st.integers(0, 9)):
    body["prompt"] = draw(_prompts())
  for k in draw(st.lists(st.sampled_from(["echo", "best_of", "suffix"]), unique=True,
                         max_size=1)):
    body[k] = draw(_ODD)
  return body


@st.composite
def chat_bodies(draw) -> dict:
  body = _common(draw)
  body.setdefault("model", MODEL)
  if "prompt" in body:                      # right values: one user turn
    body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    return body
  message = st.fixed_dictionaries(
      {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), _ODD),
       "content": st.one_of(_prompts(), _ODD, st.lists(st.one_of(
           st.fixed_dictionaries({"type": st.just("text"), "text": _prompts()}),
           st.fixed_dictionaries({"type": _ODD}), _ODD), max_size=2))})
  body["messages"] = draw(st.one_of(st.lists(message, max_size=3), _ODD))
  return body


def _raw_bodies():
  deep = st.integers(1, 200_000).map(lambda d: b"[" * d + b"]" * d)
  return st.one_of(st.binary(max_size=64), deep, st.just(b"{" * 50_000),
                   st.sampled_from([b"", b"null", b"[]", b"1", b'"x"', b"NaN", b"{}"]))


@st.composite
def exchanges(draw) -> tuple[str, str, bytes]:
  """(method, path, body bytes) of one request to the server."""
  kind = draw(st.integers(0, 9))
  if kind <= 4:
    return "POST", "/v1/completions", json.dumps(draw(completion_bodies())).encode()
  if kind <= 7:
    return "POST", "/v1/chat/completions", json.dumps(draw(chat_bodies())).encode()
  if kind == 8:
    path = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/admin/reload"]))
    return "POST", path, draw(_raw_bodies())
  method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST"]))
  path = draw(st.sampled_from(["/v1/models", "/health", "/metrics", "/v1/engines", "/",
                               "/v1/completions/x", "/%00", "/v1/admin/reload"]))
  return method, path, draw(st.sampled_from([b"", b"{}", b'{"path": "/"}']))


def send(url: str, method: str, path: str, body: bytes, headers: dict | None = None) -> int:
  """The HTTP status of one request over a fresh connection (the whole answer read, a stream
  to its end), sent as raw bytes so that no client library tidies the request first."""
  host, port = url.split("//")[1].split(":")
  head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
          f"Content-Length: {len(body)}", "Connection: close"]
  head += [f"{k}: {v}" for k, v in (headers or {}).items()]
  with socket.create_connection((host, int(port)), timeout=120) as sock:
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    reply = b""
    while chunk := sock.recv(65536):
      reply += chunk
  return int(reply.split(b" ", 2)[1])
