"""A server in a child process, started with the README's command (`launch/serve.py`): what the
tests, the load benchmark and a notebook use to talk to a real server over loopback HTTP.

    with ServerProcess(["--config=configs/tiny.py:eval",
                        "--config.model.path=assets/tiny_base"]) as server:
      server.url           # http://127.0.0.1:PORT (a free port)
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_READY = re.compile(r"serving '.*' at (http://\S+)")


class ServerProcess:
  """`python launch/serve.py ARGS --port=0` from the repository root; `url` once it listens.
  Its output is kept (`output()`); leaving the `with` block drains it with SIGTERM."""

  def __init__(self, args: list[str], timeout: float = 600.0, env: dict | None = None):
    self.args, self.timeout = list(args), timeout
    self.env = dict(os.environ if env is None else env)
    self.env.setdefault("JAX_PLATFORMS", "cpu")
    self.url = ""
    self._lines: list[str] = []
    self._proc: subprocess.Popen | None = None

  @property
  def pid(self) -> int:
    assert self._proc is not None
    return self._proc.pid

  def start(self) -> "ServerProcess":
    cmd = [sys.executable, os.path.join(ROOT, "launch", "serve.py"), *self.args, "--port=0"]
    self._proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, bufsize=1)
    ready: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, args=(ready,), daemon=True).start()
    try:
      self.url = ready.get(timeout=self.timeout)
    except queue.Empty:
      self.kill()
      raise RuntimeError(f"the server did not start in {self.timeout:.0f} s:\n"
                         f"{self.output()}") from None
    if not self.url:
      raise RuntimeError(f"the server exited before listening:\n{self.output()}")
    return self

  def _read(self, ready: queue.Queue) -> None:
    assert self._proc is not None and self._proc.stdout is not None
    told = False
    for line in self._proc.stdout:
      self._lines.append(line)
      m = _READY.search(line)
      if m and not told:
        ready.put(m.group(1))
        told = True
    if not told:
      ready.put("")

  def output(self) -> str:
    return "".join(self._lines)

  def terminate(self, timeout: float = 120.0) -> int:
    """SIGTERM (a drain), then the exit status."""
    assert self._proc is not None
    if self._proc.poll() is None:
      self._proc.send_signal(signal.SIGTERM)
    try:
      return self._proc.wait(timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise RuntimeError(f"the server did not drain in {timeout:.0f} s:\n{self.output()}") from None

  def kill(self) -> None:
    if self._proc is not None and self._proc.poll() is None:
      self._proc.kill()
      self._proc.wait()

  def rss_bytes(self) -> int:
    """The server's resident memory (Linux /proc)."""
    with open(f"/proc/{self.pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
    return 0

  def wait_exit(self, timeout: float) -> int | None:
    assert self._proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self._proc.poll() is not None:
        return self._proc.returncode
      time.sleep(0.05)
    return None

  def __enter__(self) -> "ServerProcess":
    return self.start()

  def __exit__(self, *exc) -> None:
    try:
      self.terminate()
    finally:
      self.kill()
