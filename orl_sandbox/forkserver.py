"""The launcher's side of the runner fork server (docs/verifier.md#verifier-throughput).

A sandboxed run used to start R as a fresh interpreter (`python -I -S runner.py SPEC`): about
6 ms of CPU for the interpreter and 16 ms for R's imports, paid by every sample. Instead, each
launcher process starts one *fork server* F per interpreter flavour (`runner.py --fork-server`,
a fresh interpreter started with `subprocess` like R was, with the same scrubbed environment);
F imports what R needs once and forks one R per run. A forked R sets up exactly what `Popen`
gave it (own session, the run's directory, environment and output files, no other descriptor)
and names the run's spec in its command line, so the launcher finds and ends R, I and what they
started as before. F never runs or reads a sample's code: everything below R is unchanged.

F is not R's waiter for the launcher: the launcher watches R through a pidfd (R stays F's
unreaped child until the launcher asks F to reap it, so R's pid, and with it its process group,
cannot be reused before the teardown is done), and F replies R's exit code and CPU seconds.
F exits when its stdin ends (the launcher process exited); R dies with F (R's parent-death
signal). A launcher process that forks drops its servers in the child (`os.register_at_fork`).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading

from orl_sandbox import runner


class ForkServerError(OSError):
  """The fork server could not start an R or reap one (it died or refused)."""


class ForkServer:
  """One F: `start` forks an R for a run, `reap` collects an ended R's exit code and CPU."""

  def __init__(self, command: list[str], env: dict[str, str]):
    self._lock = threading.Lock()
    request_r, self._requests = os.pipe()
    self._replies, reply_w = os.pipe()
    try:
      self._proc = subprocess.Popen(
          command + [runner.FORK_SERVER_FLAG, "." * runner.FORK_SERVER_SLOT], cwd="/", env=env,
          stdin=request_r, stdout=reply_w, stderr=subprocess.DEVNULL, close_fds=True,
          start_new_session=True)
    except OSError:
      os.close(self._requests)
      os.close(self._replies)
      raise
    finally:
      os.close(request_r)
      os.close(reply_w)
    self._buffer = b""

  @property
  def pid(self) -> int:
    return self._proc.pid

  def alive(self) -> bool:
    return self._requests >= 0 and self._proc.poll() is None

  def _readline(self) -> bytes:
    while b"\n" not in self._buffer:
      chunk = os.read(self._replies, 65536)
      if not chunk:
        raise ForkServerError("the runner fork server exited")
      self._buffer += chunk
    line, self._buffer = self._buffer.split(b"\n", 1)
    return line

  def _request(self, message: dict) -> dict:
    data = json.dumps(message).encode() + b"\n"
    with self._lock:
      try:
        if self._requests < 0:
          raise ForkServerError("the runner fork server was closed")
        if os.write(self._requests, data) != len(data):
          raise ForkServerError("a request to the runner fork server was cut short")
        reply = json.loads(self._readline())
      except (OSError, ValueError) as error:
        if isinstance(error, ForkServerError):
          raise
        raise ForkServerError(f"the runner fork server is gone: {error!r}") from error
    if "error" in reply:
      raise ForkServerError(f"the runner fork server failed: {reply['error']}")
    return reply

  def start(self, spec_path: str, cwd: str, env: dict[str, str], stdout: str,
            stderr: str) -> ForkedRunner:
    reply = self._request({"op": "start", "spec": spec_path, "cwd": cwd, "env": env,
                           "stdout": stdout, "stderr": stderr})
    return ForkedRunner(int(reply["pid"]), self)

  def reap(self, pid: int) -> tuple[int, float]:
    reply = self._request({"op": "reap", "pid": pid})
    return int(reply["returncode"]), float(reply["cpu_s"])

  def close(self) -> None:
    """Ends F (its stdin closes; it exits at once) and reaps it."""
    self.drop()
    try:
      self._proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()

  def drop(self) -> None:
    """Closes this process's ends of F's pipes (idempotent), once no request is in flight (a
    request on a dead F ends at once, at the end of its replies)."""
    with self._lock:
      for fd in (self._requests, self._replies):
        if fd >= 0:
          try:
            os.close(fd)
          except OSError:
            pass
      self._requests = self._replies = -1


class ForkedRunner:
  """An R forked by F, with the attributes the launcher reads of a `Popen` R."""

  def __init__(self, pid: int, server: ForkServer):
    self.pid, self.server = pid, server
    self.returncode: int | None = None
    self.cpu_s: float | None = None

  def reap(self) -> None:
    """Collects R's exit code and CPU (R has exited or was killed). A gone F leaves both None:
    the launcher then reports an infrastructure failure, never a verdict."""
    try:
      self.returncode, self.cpu_s = self.server.reap(self.pid)
    except ForkServerError:
      self.returncode = self.cpu_s = None


_SERVERS: dict[tuple, ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def server_for(command: list[str], env: dict[str, str]) -> ForkServer:
  """This process's F for `command` (the interpreter, its flags and the runner script), started
  on first use and again after it died."""
  key = tuple(command)
  with _SERVERS_LOCK:
    server = _SERVERS.get(key)
    if server is None or not server.alive():
      if server is not None:
        server.close()
      server = _SERVERS[key] = ForkServer(command, env)
    return server


def cpu_s(*, runners: bool = True) -> float:
  """CPU seconds this process's fork servers have used: their own (forks, reaps) and, with
  `runners`, that of every R they reaped with all R waited for (the whole sandbox of each
  finished run). Read from /proc in clock ticks; a server that died took its count with it.
  For benchmarks: an R forked by F is not this process's child, so its CPU is not in this
  process's `RUSAGE_CHILDREN`."""
  total = 0.0
  with _SERVERS_LOCK:
    pids = [server.pid for server in _SERVERS.values()]
  for pid in pids:
    try:
      fields = runner.stat_fields(pid)
    except OSError:
      continue
    ticks = fields[11:15] if runners else fields[11:13]   # utime stime [cutime cstime]
    total += sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK")
  return total


@functools.cache
def available() -> bool:
  """Whether the launcher can watch a process that is not its child (a pidfd: Linux >= 5.3);
  asked once per process (every run asks)."""
  if not hasattr(os, "pidfd_open") or sys.platform != "linux":
    return False
  try:
    os.close(os.pidfd_open(os.getpid()))
  except OSError:
    return False
  return True


def shutdown() -> None:
  """Ends every F of this process (tests; a process's F also ends when the process does)."""
  with _SERVERS_LOCK:
    servers = list(_SERVERS.values())
    _SERVERS.clear()
  for server in servers:
    server.close()


def _forget_in_child() -> None:
  """In a forked child of the launcher process: the parent's servers are not its own, so their
  pipes are closed here (F still sees its stdin end when the parent exits) and the child starts
  its own server when it needs one."""
  global _SERVERS_LOCK  # pylint: disable=global-statement
  _SERVERS_LOCK = threading.Lock()
  for server in _SERVERS.values():
    server._lock = threading.Lock()  # pylint: disable=protected-access   # (a thread that held
    server.drop()                    # it was not copied into this child)
  _SERVERS.clear()


os.register_at_fork(after_in_child=_forget_in_child)
