"""The HTTP side: an OpenAI-compatible API on Starlette, served by uvicorn.

Handlers never touch the device: they validate a request (`protocol.parse`: a 400 with one
sentence for anything wrong), tokenize it, `submit` it to the scheduler and await its events
on an asyncio queue (the scheduler thread puts them there with `call_soon_threadsafe`). A
streamed request sends one server-sent event per committed block; a client that disconnects
cancels its request (its rows are freed at the next device call).

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics, POST /v1/admin/reload (new weights: `Routes.reload`).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import random
import re
import time
from typing import Any, Callable, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orl_jax.data.prompts import render_chat
from orl_jax.data.tokenizer import UnknownWordError
from orl_jax.serve import keys, protocol
from orl_jax.serve.keys import Access
from orl_jax.serve.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from orl_jax.serve.protocol import RequestError
from orl_jax.serve.scheduler import Draining, Event, QueueFull, Request, Scheduler
from orl_jax.unmasking import UnmaskRule


@dataclasses.dataclass
class Served:
  """One served model and what its requests are checked against."""
  name: str
  tokenizer: Any
  chat: str                          # chat template (`data.prompts.CHAT_TEMPLATES`)
  scheduler: Scheduler
  metrics: ServerMetrics
  rule: UnmaskRule                   # the config's decoder setting (a request may choose its own)
  temperature: float                 # the config's
  samples: bool                      # the decoder takes a request's temperature
  rules: tuple[str, ...]             # unmasking rules a request may choose (none: only `rule`)
  prompt_len: int                    # prompt tokens at most
  gen_length: int                    # response tokens at most
  # path -> parameters of the served tree (POST /v1/admin/reload), None: reloading refused
  load_params: Callable[[str], Any] | None = None
  source: str = ""                   # the weights served (a path)
  access: Access = keys.OPEN         # keys and the reload root (`keys`)
  # a request's fixed_steps k at most this (None: unchecked)
  block_size: int | None = dataclasses.field(kw_only=True)
  max_body_bytes: int = dataclasses.field(kw_only=True)   # a larger body is a 413

  @property
  def fingerprint(self) -> str:
    return f"orl-{self.name}-v{self.scheduler.model_version + 1}"


_OUTCOMES = {400: "bad_request", 401: "unauthorized", 403: "unauthorized", 404: "not_found",
             408: "bad_request", 413: "bad_request", 429: "queue_full", 503: "draining"}


def _error(status: int, message: str, param: str | None = None,
           kind: str = "invalid_request_error", code: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
  return JSONResponse(protocol.error_body(message, kind, param, code), status_code=status,
                      headers=headers)


def _sse(obj) -> bytes:
  return f"data: {json.dumps(obj)}\n\n".encode()


_GONE = Event("gone", -1, "")     # the client disconnected (`_Call.watch_disconnect`)


class _Call:
  """One request's choices in flight (`n` per prompt): the scheduler's events arrive on the
  event loop (`push`), choice numbers offset by prompt as OpenAI numbers them."""

  def __init__(self, served: Served, n_prompts: int, n: int, prompt_tokens: int):
    self.served, self.loop = served, asyncio.get_running_loop()
    self._events: collections.deque[Event] = collections.deque()
    self._waiter: asyncio.Future | None = None
    self.requests: list[Request] = []
    self.n, self.total, self.prompt_tokens = n, n_prompts * n, prompt_tokens
    self.arrival = time.monotonic()
    self.first_block = False
    self.done: dict[int, dict] = {}

  def push(self, event: Event) -> None:
    """(On the event loop.) An event for `next_event`."""
    self._events.append(event)
    if self._waiter is not None and not self._waiter.done():
      self._waiter.set_result(None)

  def emitter(self, prompt_index: int) -> Callable[[Event], None]:
    offset = prompt_index * self.n

    def emit(event: Event) -> None:
      self.loop.call_soon_threadsafe(self.push, event._replace(choice=event.choice + offset))
    return emit

  def cancel(self) -> None:
    for r in self.requests:
      self.served.scheduler.cancel(r)

  async def watch_disconnect(self, http: HttpRequest) -> None:
    """Pushes `_GONE` once the client has disconnected."""
    while (await http.receive())["type"] != "http.disconnect":
      pass
    self.push(_GONE)

  async def next_event(self) -> Event:
    """The next event; a `done` one is kept (`choices`), the first block timed."""
    while not self._events:
      self._waiter = self.loop.create_future()
      await self._waiter
    event = self._events.popleft()
    if event.kind == "block" and not self.first_block:
      self.first_block = True
      self.served.metrics.ttfb.observe(time.monotonic() - self.arrival)
    elif event.kind == "done":
      self.done[event.choice] = {"index": event.choice, "text": event.text,
                                 "finish_reason": event.finish_reason, "usage": event.usage}
    elif event.kind == "error":
      raise RuntimeError(event.text)
    return event

  @property
  def finished(self) -> bool:
    return len(self.done) == self.total

  def choices(self) -> list[dict]:
    return [self.done[i] for i in sorted(self.done)]

  def usage(self) -> dict:
    """The request's usage (`protocol.usage_dict`), counted in the metrics once."""
    admitted = [r.admitted for r in self.requests if r.admitted is not None]
    queue_seconds = max(0.0, min(admitted) - self.arrival) if admitted else 0.0
    usage = protocol.usage_dict(self.prompt_tokens, [c["usage"] for c in self.choices()],
                                queue_seconds)
    m = self.served.metrics
    m.requests.labels("ok").inc()
    m.served(usage)
    m.latency.observe(time.monotonic() - self.arrival)
    m.queue_wait.observe(queue_seconds)
    return usage


def _encode(served: Served, text_or_ids, param: str) -> list[int]:
  """A prompt's token ids, checked against the vocabulary and the engine's prompt length."""
  if isinstance(text_or_ids, list):
    ids = list(text_or_ids)
    if not ids:
      raise RequestError(f"{param} has no tokens", param=param)
    bad = [i for i in ids if not 0 <= i < served.tokenizer.vocab_size]
    if bad:
      raise RequestError(f"{param}: token id {bad[0]} is outside the vocabulary of "
                         f"{served.tokenizer.vocab_size}", param=param)
  else:
    if not text_or_ids.strip():
      raise RequestError(f"{param} is empty", param=param)
    try:
      ids = served.tokenizer.encode(text_or_ids)
    except UnknownWordError as e:
      raise RequestError(f"{param}: the word {e.word!r} is not in this model's lexicon; a "
                         f"prompt uses numbers and the words {' '.join(served.tokenizer.lexicon)}"
                         " (docs/serving.md#the-tiny-models-words)", param=param) from None
    except ValueError as e:
      raise RequestError(f"{param} cannot be tokenized: {e}", param=param) from None
  if len(ids) > served.prompt_len:
    raise RequestError(f"{param} is {len(ids)} tokens, longer than this engine's context of "
                       f"{served.prompt_len} prompt tokens (task.prompt_len)", param=param)
  return ids


def _settings(served: Served, req, max_tokens: int | None):
  """(rule, temperature, max_tokens, seed) of a request, checked against the engine."""
  rule = req.rule(served.block_size) or served.rule
  if rule != served.rule and rule.name not in served.rules:
    rules = f"one of {', '.join(served.rules)}" if served.rules else f"{served.rule.label} only"
    raise RequestError(f"decoder {rule.label!r}: this model decodes with {rules}",
                       param="decoder")
  if req.temperature is not None and not served.samples and req.temperature != served.temperature:
    raise RequestError("this model's sampler has its own temperature schedule: leave "
                       "temperature out", param="temperature")
  temperature = served.temperature if req.temperature is None else req.temperature
  limit = served.gen_length if max_tokens is None else max_tokens
  if limit > served.gen_length:
    raise RequestError(f"max_tokens={limit} is more than this engine's generation length of "
                       f"{served.gen_length} tokens (decode.gen_length)", param="max_tokens")
  seed = req.seed if req.seed is not None else _SEEDS.getrandbits(64)
  return rule, temperature, limit, seed


def _fits(served: Served, n_prompts: int, n: int) -> None:
  """A 400 for a request with more choices (prompts x n) than the scheduler ever queues at
  once (`serve.max_waiting`): a 429's "retry later" would never come true for it."""
  limit = served.scheduler.max_waiting
  if n_prompts * n > limit:
    raise RequestError(f"this request asks for {n_prompts * n} choices ({n_prompts} prompt(s) "
                       f"x n={n}), more than this server ever queues at once (serve.max_waiting="
                       f"{limit}): send fewer prompts or a smaller n",
                       param="prompt" if n == 1 else "n")


MAX_JSON_DEPTH = 32       # no request field nests deeper than 3; a body may add a few levels
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
  """How deep the arrays and objects of JSON text `raw` nest (brackets inside strings do not
  count), without decoding it: deep text is refused before a recursive decoder sees it."""
  brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
  depth = deepest = 0
  for b in brackets:
    depth += 1 if b in b"[{" else -1
    deepest = max(deepest, depth)
  return deepest


_SEEDS = random.Random(os.urandom(16))    # a request without a seed samples with one of these


class Routes:
  """The API of one served model (module docstring); `create_app` mounts it."""

  def __init__(self, served: Served, body_timeout: float = 30.0):
    self.served, self.body_timeout = served, body_timeout

  async def _body(self, http: HttpRequest):
    """The request's JSON, read up to `serve.max_body_bytes` (413 past it) and nested at most
    `MAX_JSON_DEPTH` deep (Python's decoder recurses per level)."""
    limit, chunks, size = self.served.max_body_bytes, [], 0
    parts = http.stream()
    while True:
      try:
        chunk = await asyncio.wait_for(anext(parts), self.body_timeout)
      except StopAsyncIteration:
        break
      except asyncio.TimeoutError:
        raise RequestError(f"the request body stalled for {self.body_timeout:g} s "
                           "(serve.body_timeout)", status=408) from None
      size += len(chunk)
      if size > limit:
        raise RequestError(f"the request body is over this server's limit of {limit} bytes "
                           "(serve.max_body_bytes)", status=413)
      chunks.append(chunk)
    raw = b"".join(chunks)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
      raise RequestError(f"the request body nests {depth} levels deep; at most "
                         f"{MAX_JSON_DEPTH} are taken")
    try:
      return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise RequestError(f"the request body is not valid JSON ({e})") from None

  def _check_model(self, name: str) -> None:
    if name != self.served.name:
      raise RequestError(f"model {name!r} is not served here; GET /v1/models lists "
                         f"{self.served.name!r}", status=404, param="model")

  def _start(self, prompts: list[list[int]], req, max_tokens: int | None) -> _Call:
    """The request's choices submitted to the scheduler: a 400 when they can never all wait
    at once (`_fits`), a 429 when the queue is full now, a 503 while draining."""
    _fits(self.served, len(prompts), req.n)
    call = _Call(self.served, len(prompts), req.n, sum(len(p) for p in prompts))
    rule, temperature, limit, seed = _settings(self.served, req, max_tokens)
    try:
      for i, ids in enumerate(prompts):
        r = Request(ids, limit, rule, temperature, (seed + i) % 2**64, call.emitter(i),
                    n=req.n, stop=req.stop_strings(), stream=req.stream,
                    denoise=req.orl_denoise)
        self.served.scheduler.submit(r)
        call.requests.append(r)
    except QueueFull as e:
      call.cancel()
      raise RequestError(str(e), status=429, kind="rate_limit_error") from None
    except Draining as e:
      call.cancel()
      raise RequestError(str(e), status=503, kind="server_error") from None
    return call

  async def _collect(self, call: _Call, http: HttpRequest) -> bool:
    """Waits for every choice; False when the client went away first (then cancelled)."""
    watch = asyncio.ensure_future(call.watch_disconnect(http))
    try:
      while not call.finished:
        if (await call.next_event()) is _GONE:
          call.cancel()
          self.served.metrics.requests.labels("cancelled").inc()
          return False
    finally:
      watch.cancel()
    return True

  async def completions(self, http: HttpRequest):
    req = protocol.parse(protocol.CompletionRequest, await self._body(http))
    self._check_model(req.model)
    call = self._start([_encode(self.served, p, "prompt") for p in req.prompts()], req,
                       req.max_tokens)
    rid, s = protocol.new_id("cmpl"), self.served
    if req.stream:
      return self._stream(call, req.include_usage, lambda i, text, reason=None: protocol.
                          completion_chunk(rid, s.name, s.fingerprint, i, text, reason))
    if not await self._collect(call, http):
      return Response(status_code=499)
    return JSONResponse(protocol.completion_body(rid, s.name, s.fingerprint, call.choices(),
                                                 call.usage()))

  async def chat(self, http: HttpRequest):
    req = protocol.parse(protocol.ChatRequest, await self._body(http))
    self._check_model(req.model)
    turns = req.turns()
    try:
      text = render_chat(turns, self.served.chat)
    except ValueError as e:
      raise RequestError(str(e), param="messages") from None
    call = self._start([_encode(self.served, text, "messages")], req, req.token_limit)
    rid, s = protocol.new_id("chatcmpl"), self.served

    def chunk(i, text, reason=None, role=False):
      delta = {"role": "assistant", "content": ""} if role else (
          {} if reason else {"content": text})
      return protocol.chat_chunk(rid, s.name, s.fingerprint, i, delta, reason)
    if req.stream:
      return self._stream(call, req.include_usage, chunk,
                          opening=lambda i: chunk(i, "", role=True))
    if not await self._collect(call, http):
      return Response(status_code=499)
    return JSONResponse(protocol.chat_body(rid, s.name, s.fingerprint, call.choices(),
                                           call.usage()))

  def _stream(self, call: _Call, include_usage: bool, chunk, opening=None) -> StreamingResponse:
    """Server-sent events: `opening(i)` per choice, a chunk per committed block, a last chunk
    per choice with its finish reason, with `include_usage` a chunk with `choices: []` and
    the usage (the other chunks then carry `"usage": null`, as OpenAI sends them), `[DONE]`.
    A client that goes away cancels the request (Starlette stops the generator)."""
    def sse(obj: dict) -> bytes:
      return _sse({**obj, "usage": None} if include_usage else obj)

    async def events():
      try:
        for i in range(call.total if opening else 0):
          yield sse(opening(i))
        while not call.finished:
          try:
            event = await call.next_event()
          except RuntimeError as e:
            yield _sse(protocol.error_body(str(e), "server_error"))
            break
          if event.kind == "block":
            yield sse(chunk(event.choice, event.text))
          elif event.kind == "canvas":
            yield sse(protocol.denoise_chunk(chunk(event.choice, ""), event.canvas))
          else:
            yield sse(chunk(event.choice, "", event.finish_reason))
        if call.finished:
          usage = call.usage()          # counted in the metrics whether it is sent or not
          if include_usage:
            yield _sse(protocol.usage_chunk(chunk(0, ""), usage))
        yield b"data: [DONE]\n\n"
      finally:
        if not call.finished:
          call.cancel()
          self.served.metrics.requests.labels("cancelled").inc()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})

  async def health(self, _: HttpRequest):
    st, served = self.served.scheduler.stats(), self.served
    body = {"status": "draining" if st.draining else "ok", "model": served.name,
            "model_version": st.model_version + 1, "weights": served.source,
            "waiting": st.waiting, "active": st.active, "busy_rows": st.busy_rows,
            "rows": st.rows, "device_calls": st.calls, "engine_iterations": st.iterations}
    if served.scheduler.error is not None:
      body["status"] = f"engine stopped: {served.scheduler.error}"
      return JSONResponse(body, status_code=500)
    return JSONResponse(body, status_code=503 if st.draining else 200)

  async def metrics(self, _: HttpRequest):
    st, m = self.served.scheduler.stats(), self.served.metrics
    m.queue_depth.set(st.waiting)
    m.model_version.set(st.model_version + 1)
    return Response(m.text(), media_type=CONTENT_TYPE_LATEST)

  async def models(self, _: HttpRequest):
    return JSONResponse({"object": "list", "data": [{"id": self.served.name, "object": "model",
                                                     "created": 0, "owned_by": "orl_jax"}]})

  async def reload(self, http: HttpRequest):
    """{"path": DIR}: serve the weights at DIR (the same model's) once the requests in flight
    finish; waiting requests wait, none is dropped. -> the new model version."""
    body = await self._body(http)
    if not isinstance(body, dict) or set(body) != {"path"} or not isinstance(body["path"], str):
      raise RequestError('the body is {"path": DIR}: a params folder, a run\'s work directory '
                         "or a Hugging Face directory of the served model", param="path")
    served = self.served
    if served.load_params is None:
      raise RequestError("this server was started without a weights loader")
    folder = keys.reload_folder(served.access, body["path"])
    try:
      params = await asyncio.get_running_loop().run_in_executor(None, served.load_params, folder)
    except (ValueError, OSError) as e:
      raise RequestError(f"cannot load {body['path']!r}: {keys.scrubbed(served.access, str(e))}",
                         param="path") from None
    version = await asyncio.wrap_future(served.scheduler.reload(params))
    served.source = folder
    return JSONResponse({"model": served.name, "model_version": version + 1,
                         "path": body["path"]})


async def _discard_body(receive, limit: int, timeout: float) -> None:
  """Reads a refused request's body (up to `limit` bytes, `timeout` seconds a part) so that
  its client, which sends the whole body before it reads, gets the answer and not a reset."""
  size = 0
  while size <= limit:
    try:
      message = await asyncio.wait_for(receive(), timeout)
    except asyncio.TimeoutError:
      return
    if message["type"] != "http.request":
      return
    size += len(message.get("body", b""))
    if not message.get("more_body", False):
      return


def _keyed(app, served: Served, body_timeout: float):
  """`app` behind the key check (`keys.check`): a request without a key it needs gets
  OpenAI's 401 (403 for the admin routes when they are off); its body is read and dropped,
  never parsed."""
  async def wrapped(scope, receive, send):
    if scope["type"] == "http":
      authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
      try:
        keys.check(served.access, scope["path"], authorization)
      except RequestError as e:
        served.metrics.requests.labels(_OUTCOMES[e.status]).inc()
        await _discard_body(receive, served.max_body_bytes, body_timeout)
        await _error(e.status, str(e), e.param, e.kind, e.code)(scope, receive, send)
        return
    await app(scope, receive, send)
  return wrapped


def create_app(served: Served, body_timeout: float = 30.0):
  """The ASGI application of `served` (module docstring): Starlette's routes behind the key
  check (`_keyed`); `body_timeout`: seconds a client may pause while sending a body
  (serve.body_timeout), then a 408."""
  r = Routes(served, body_timeout)

  async def request_error(_, e: Exception):
    assert isinstance(e, RequestError)
    served.metrics.requests.labels(_OUTCOMES.get(e.status, "bad_request")).inc()
    return _error(e.status, str(e), e.param, e.kind, e.code)

  async def http_error(http: HttpRequest, e: Exception):
    assert isinstance(e, StarletteHTTPException)
    message = {404: f"no route {http.method} {http.url.path}: see docs/serving.md",
               405: f"{http.method} is not allowed on {http.url.path}"}.get(e.status_code,
                                                                             str(e.detail))
    return _error(e.status_code, message, headers=e.headers)     # 405: its `Allow` header

  async def gone(_, e: Exception):
    """A client that closed its connection mid-body: cancelled, as one that leaves
    mid-response (nobody reads the answer)."""
    served.metrics.requests.labels("cancelled").inc()
    return Response(status_code=499)

  async def internal(_, e: Exception):
    served.metrics.requests.labels("error").inc()
    return _error(500, f"internal error: {e}", kind="server_error")

  return _keyed(Starlette(routes=[
      Route("/v1/completions", r.completions, methods=["POST"]),
      Route("/v1/chat/completions", r.chat, methods=["POST"]),
      Route("/v1/models", r.models, methods=["GET"]),
      Route("/health", r.health, methods=["GET"]),
      Route("/metrics", r.metrics, methods=["GET"]),
      Route("/v1/admin/reload", r.reload, methods=["POST"]),
  ], exception_handlers={RequestError: request_error, StarletteHTTPException: http_error,
                         ClientDisconnect: gone, Exception: internal}), served, body_timeout)
