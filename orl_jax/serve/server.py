"""Running a served model under uvicorn: `serve_forever`.

SIGTERM (a preempted VM, `kill`, a container stop) and Ctrl-C drain: new requests get 503, the
requests in flight and waiting finish, then the process exits 0; a second signal stops at
once. The first line printed once the port listens names the address (`--port=0` picks a
free port).
"""
from __future__ import annotations

import logging
import signal
import threading
import time

import uvicorn

from orl_jax.serve.app import Served, create_app


class _DrainingServer(uvicorn.Server):
  """uvicorn's server whose first exit signal drains the scheduler (module docstring)."""

  def __init__(self, config: uvicorn.Config, served: Served):
    super().__init__(config)
    self.served = served
    self.draining = False
    self.address = ""

  async def startup(self, sockets=None) -> None:
    await super().startup(sockets=sockets)
    if not self.started:
      return
    host, port = self.servers[0].sockets[0].getsockname()[:2]
    self.address = f"http://{host}:{port}"
    print(f"serving {self.served.name!r} at {self.address} (POST /v1/completions, "
          "/v1/chat/completions; GET /v1/models, /health, /metrics)", flush=True)

  def handle_exit(self, sig: int, frame) -> None:
    if self.draining:
      super().handle_exit(sig, frame)
      return
    self.draining = True
    name = signal.Signals(sig).name if sig else "exit"
    print(f"{name}: draining (new requests get 503; the ones in flight finish)", flush=True)
    self.served.scheduler.drain()
    threading.Thread(target=self._exit_when_idle, name="orl-drain", daemon=True).start()

  def _exit_when_idle(self) -> None:
    while not self.served.scheduler.idle() and self.served.scheduler.error is None:
      time.sleep(0.02)
    self.should_exit = True


def serve_forever(served: Served, host: str = "127.0.0.1", port: int = 8000,
                  watcher=None) -> None:
  """Serves until a signal drains the server (module docstring). `watcher`: a started
  background poller of new weights, stopped on exit."""
  config = uvicorn.Config(create_app(served), host=host, port=port, log_level="warning",
                          access_log=False, lifespan="off", timeout_graceful_shutdown=None)
  server = _DrainingServer(config, served)
  try:
    server.run()
  finally:
    if watcher is not None:
      watcher.stop()
    served.scheduler.stop(timeout=60)
  if served.scheduler.error is not None:
    logging.error("the engine stopped: %s", served.scheduler.error)
    raise SystemExit(1)
  print("drained: every request answered; exiting", flush=True)
