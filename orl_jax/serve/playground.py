"""The playground page and several models behind one port (docs/serving.md#the-playground).

`front(models)` is the ASGI application `launch/serve.py` serves. `GET /` is the playground, a
static page (`static/playground.{html,js,css}`, no build step, nothing fetched from elsewhere)
that sends one prompt to every served model, streamed with `orl_denoise` on, and draws each
response's canvas filling in: masks, each token as the decoder commits it with the forward
that committed it, and the forwards and TPF at the end.

Every other route is the API (`app.create_app`): with one model, that model's, unchanged; with
several (`--models=base=DIR,orl=DIR`), a completion or chat request goes to the model its
`model` field names (a name not served is a 404 sentence that lists them), `GET /v1/models`
lists them all, and the rest (`/health`, `/metrics`, `/v1/admin/reload`) is the first model's.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
from typing import Sequence

from starlette.responses import JSONResponse, Response

from orl_jax.serve import keys, protocol
from orl_jax.serve.app import MAX_JSON_DEPTH, Served, create_app, json_depth

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# path -> (file under STATIC, media type)
PAGES = {"/": ("playground.html", "text/html; charset=utf-8"),
         "/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
         "/playground.css": ("playground.css", "text/css; charset=utf-8")}
ROUTED = ("/v1/completions", "/v1/chat/completions")    # requests that name their model


def page(path: str) -> Response:
  """The playground's file at `path` (a key of PAGES)."""
  name, media_type = PAGES[path]
  with open(os.path.join(STATIC, name), "rb") as f:
    return Response(f.read(), media_type=media_type, headers={"Cache-Control": "no-cache"})


def models_body(models: Sequence[Served]) -> dict:
  """GET /v1/models: every served model, in the order served."""
  return {"object": "list", "data": [{"id": m.name, "object": "model", "created": 0,
                                      "owned_by": "orl_jax"} for m in models]}


async def read_body(receive, limit: int, timeout: float) -> tuple[list[dict], bytes | None]:
  """(the messages received, the whole body): read until the body ends, passes `limit` bytes,
  pauses `timeout` seconds or the client leaves (then the body is None: the model's own app
  answers what is wrong, from the same messages)."""
  messages: list[dict] = []
  chunks: list[bytes] = []
  size = 0
  while True:
    try:
      message = await asyncio.wait_for(receive(), timeout)
    except asyncio.TimeoutError:
      return messages, None
    messages.append(message)
    if message["type"] != "http.request":
      return messages, None
    chunks.append(message.get("body", b""))
    size += len(chunks[-1])
    if not message.get("more_body", False):
      return messages, b"".join(chunks)
    if size > limit:
      return messages, None


def named_model(body: bytes) -> str | None:
  """The `model` a request body names (None: no string there, or a body the model's app
  refuses for another reason)."""
  if json_depth(body) > MAX_JSON_DEPTH:
    return None
  try:
    request = json.loads(body)
  except (json.JSONDecodeError, UnicodeDecodeError):
    return None
  name = request.get("model") if isinstance(request, dict) else None
  return name if isinstance(name, str) else None


def _replayed(messages: list[dict], receive):
  """`receive` that first gives back the messages already read."""
  pending = collections.deque(messages)

  async def replay():
    return pending.popleft() if pending else await receive()
  return replay


def front(models: Sequence[Served], body_timeout: float = 30.0):
  """The ASGI application of `models` (module docstring; the first is the default); names
  must differ."""
  names = [m.name for m in models]
  if len(set(names)) != len(names):
    raise ValueError(f"served models need distinct names, got {names}")
  apps = {m.name: create_app(m, body_timeout) for m in models}
  first = models[0]
  listed = ", ".join(repr(n) for n in names)

  def authorized(scope) -> bool:
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    try:
      keys.check(first.access, scope["path"], header)
    except protocol.RequestError:
      return False     # the model's app answers it (401, its body dropped)
    return True

  async def app(scope, receive, send):
    path, method = scope.get("path"), scope.get("method")
    if scope["type"] == "http" and method in ("GET", "HEAD") and path in PAGES:
      await page(path)(scope, receive, send)
      return
    if len(models) > 1 and scope["type"] == "http" and authorized(scope):
      if path == "/v1/models" and method == "GET":
        await JSONResponse(models_body(models))(scope, receive, send)
        return
      if path in ROUTED and method == "POST":
        messages, body = await read_body(receive, first.max_body_bytes, body_timeout)
        name = named_model(body) if body is not None else None
        if name is not None and name not in apps:
          first.metrics.requests.labels("not_found").inc()
          await JSONResponse(protocol.error_body(
              f"model {name!r} is not served here; GET /v1/models lists {listed}",
              param="model"), status_code=404)(scope, receive, send)
          return
        await apps[name or first.name](scope, _replayed(messages, receive), send)
        return
    await apps[first.name](scope, receive, send)
  return app
