"""Running a served model under uvicorn: `serve_forever`.

SIGTERM (a preempted VM, `kill`, a container stop) and Ctrl-C drain: new requests get 503, the
requests in flight and waiting finish, then the process exits 0; a second signal stops at
once. The drain ends within `serve.drain_timeout` seconds whatever clients hold: what is still
open then is cancelled. A client gets `serve.header_timeout` seconds to send a request head,
`serve.body_timeout` between two parts of its body (`Routes._body`) and `serve.idle_timeout`
idle on a kept-alive connection; a connection past one is closed. The first line printed
once the port listens names the address (`--port=0` picks a free port); the engine is compiled
by then (`load.warm`). Several models (`--models`) share the port and the drain
(`playground.front`); `GET /` is the playground. The last line says whether the drain
answered every request or cut some off.
"""
from __future__ import annotations

import asyncio
import logging
import math
import signal
import threading
import time
from typing import Sequence

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from starlette.responses import JSONResponse

from orl_jax.serve.app import Served
from orl_jax.serve.playground import front
from orl_jax.serve.protocol import error_body


class _HeadTimedProtocol(HttpToolsProtocol):
  """uvicorn's HTTP/1.1 protocol that closes a connection whose request head (request line and
  headers) is not complete `config.header_timeout` seconds after the connection or the head's
  first byte: a silent or trickling client holds no socket for ever (slowloris)."""

  _head_timer: asyncio.TimerHandle | None = None

  def _arm_head_timer(self) -> None:
    self._disarm_head_timer()
    timeout = self.config.header_timeout      # type: ignore[attr-defined]  # serve_forever's
    self._head_timer = self.loop.call_later(timeout, self._head_late)

  def _disarm_head_timer(self) -> None:
    if self._head_timer is not None:
      self._head_timer.cancel()
      self._head_timer = None

  def _head_late(self) -> None:
    if not self.transport.is_closing():
      self.transport.close()

  def connection_made(self, transport) -> None:  # type: ignore[override]
    super().connection_made(transport)
    self._arm_head_timer()

  def connection_lost(self, exc) -> None:
    self._disarm_head_timer()
    super().connection_lost(exc)

  def on_message_begin(self) -> None:
    super().on_message_begin()
    self._arm_head_timer()

  def on_headers_complete(self) -> None:
    self._disarm_head_timer()
    super().on_headers_complete()


def _cut_at_drain_end(app, served: Served, cut: list[int]):
  """`app`, whose requests still open when the drain's time is up (uvicorn cancels their
  tasks) end as `cancelled`: a 503 sentence where no response has started, else the end of
  the response begun, and no traceback in the log; `cut[0]` counts them (the closing line)."""
  async def wrapped(scope, receive, send):
    started, complete = False, False

    async def watched_send(message):
      nonlocal started, complete
      started = started or message["type"] == "http.response.start"
      complete = complete or (message["type"] == "http.response.body"
                              and not message.get("more_body", False))
      await send(message)

    try:
      await app(scope, receive, watched_send)
    except asyncio.CancelledError:
      cut[0] += 1
      served.metrics.requests.labels("cancelled").inc()
      if not started:
        await JSONResponse(error_body("the server shut down (serve.drain_timeout) before this "
                                      "request was answered", "server_error"),
                           status_code=503)(scope, receive, send)
      elif not complete:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
  return wrapped


class _DrainingServer(uvicorn.Server):
  """uvicorn's server whose first exit signal drains the scheduler (module docstring)."""

  def __init__(self, config: uvicorn.Config, models: Sequence[Served], drain_timeout: float):
    super().__init__(config)
    self.models, self.drain_timeout = list(models), drain_timeout
    self.draining = False
    self.address = ""

  async def startup(self, sockets=None) -> None:
    await super().startup(sockets=sockets)
    if not self.started:
      return
    host, port = self.servers[0].sockets[0].getsockname()[:2]
    self.address = f"http://{host}:{port}"
    names = ", ".join(repr(m.name) for m in self.models)
    print(f"serving {names} at {self.address} (POST /v1/completions, /v1/chat/completions; "
          "GET /v1/models, /health, /metrics; the playground at /)", flush=True)

  def handle_exit(self, sig: int, frame) -> None:
    if self.draining:
      super().handle_exit(sig, frame)
      return
    self.draining = True
    name = signal.Signals(sig).name if sig else "exit"
    print(f"{name}: draining (new requests get 503; the ones in flight finish)", flush=True)
    for m in self.models:
      m.scheduler.drain()
    threading.Thread(target=self._exit_when_idle, name="orl-drain", daemon=True).start()

  def _exit_when_idle(self) -> None:
    """Exits once the engine is idle or the drain's time is up; uvicorn then waits for the
    open connections the rest of `drain_timeout` and cancels what remains."""
    deadline = time.monotonic() + self.drain_timeout
    schedulers = [m.scheduler for m in self.models]
    while (not all(s.idle() for s in schedulers) and all(s.error is None for s in schedulers)
           and time.monotonic() < deadline):
      time.sleep(0.02)
    # uvicorn waits this long for the open connections, then cancels them
    self.config.timeout_graceful_shutdown = max(1, math.ceil(deadline - time.monotonic()))
    self.should_exit = True


def serve_forever(served: Served, host: str = "127.0.0.1", port: int = 8000,
                  watcher=None, limits=None, also: Sequence[Served] = ()) -> None:
  """Serves until a signal drains the server (module docstring). `watcher`: a started
  background poller of new weights, stopped on exit; `limits`: the config's `serve` section
  (its timeouts; None: the section's defaults); `also`: more models on the same port
  (`served` is the default one)."""
  if limits is None:
    from orl_jax.config.sections import Serve
    limits = Serve()
  models = [served, *also]
  cut = [0]            # requests the drain's end cut off
  app = _cut_at_drain_end(front(models, body_timeout=limits.body_timeout), served, cut)
  config = uvicorn.Config(app, host=host,
                          port=port, log_level="warning", access_log=False, lifespan="off",
                          http=_HeadTimedProtocol, timeout_keep_alive=limits.idle_timeout,
                          timeout_graceful_shutdown=limits.drain_timeout)
  config.header_timeout = limits.header_timeout    # type: ignore[attr-defined]  # the protocol's
  server = _DrainingServer(config, models, limits.drain_timeout)
  try:
    server.run()
  finally:
    if watcher is not None:
      watcher.stop()
    for m in models:
      m.scheduler.stop(timeout=10)     # it stops after the device call it is in
  for m in models:
    if m.scheduler.error is not None:
      logging.error("the engine of %r stopped: %s", m.name, m.scheduler.error)
      raise SystemExit(1)
  left = sum(s.active + s.waiting for s in (m.scheduler.stats() for m in models))
  print(_closing_line(cut[0], left, limits.drain_timeout), flush=True)


def _closing_line(cut: int, left: int, drain_timeout: float) -> str:
  """What the drain did: every request answered, or how many it cut off (requests whose
  handler was cancelled; else the choices `left` in the engines when no handler was)."""
  if not (cut or left):
    return "drained: every request answered; exiting"
  what = f"{cut} request(s)" if cut else f"{left} choice(s)"
  return f"drain timeout ({drain_timeout:g} s, serve.drain_timeout): {what} cut off; exiting"
