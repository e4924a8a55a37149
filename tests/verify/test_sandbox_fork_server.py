"""The runner fork server (orl_sandbox/forkserver.py; docs/verifier.md#verifier-throughput).

A forked R must be indistinguishable from a fresh one to the sample and to the launcher: the same
verdicts and layers, the run named in R's and I's command lines (the teardown's sweep), nothing
left behind, and a fork server that dies or is inherited by a forked launcher costs a run an
infrastructure error at worst, never a verdict.
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from orl_sandbox import forkserver
from orl_sandbox import launcher as sandbox
from tests.support.sandbox import sandbox_processes

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux"),
    pytest.mark.skipif(not forkserver.available(), reason="no pidfds: R is never forked")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRELUDE = "def add(a, b):\n"
TESTS = "def check(candidate):\n  assert candidate(2, 3) == 5\n"
BODIES = {"pass": "  return a + b\n", "fail": "  return a - b\n",
          "syntax": "  x = 1 )(\n", "exit": "  import os; os._exit(0)\n",
          "loop": "  while True:\n    pass\n"}


def _judged(body: str, **limits) -> sandbox.SandboxResult:
  return sandbox.run_judged(PRELUDE + body, "add", TESTS, PRELUDE,
                            sandbox.SandboxLimits(timeout_s=3.0, **limits))


def _servers() -> list[forkserver.ForkServer]:
  return list(forkserver._SERVERS.values())  # pylint: disable=protected-access


def test_a_forked_runner_gives_a_fresh_runners_verdicts_and_layers():
  for name, body in BODIES.items():
    forked, fresh = _judged(body), _judged(body, fork_server=False)
    assert (forked.verdict, forked.timed_out, forked.infra_error) == (
        fresh.verdict, fresh.timed_out, fresh.infra_error), name
    strip = lambda layers: sorted(layer for layer in layers if not layer.startswith(
        ("uid:", "judge-uid:")))   # a per-sample uid differs from run to run
    assert strip(forked.isolation) == strip(fresh.isolation), name
    assert forked.runner_cpu_s is not None and fresh.runner_cpu_s is not None
  assert len(_servers()) == 1


def test_the_run_is_named_in_the_forked_runners_command_line(private_tmp):
  """While a sample sleeps, R and I carry the run's spec path (under this test's temp root) in
  their command lines, as a fresh R does; after the run no such process is left."""
  found = []

  def watch():
    deadline = time.monotonic() + 5.0
    while not found and time.monotonic() < deadline:
      found.extend(sandbox_processes(private_tmp))
      time.sleep(0.02)

  watcher = threading.Thread(target=watch)
  watcher.start()
  result = sandbox.run_python("import time\ntime.sleep(1.5)\n",
                              sandbox.SandboxLimits(timeout_s=5.0))
  watcher.join()
  assert result.passed, result
  assert found, "no process named the run while it ran"
  assert all(server.pid not in found for server in _servers())   # F never names a run
  assert sandbox_processes(private_tmp) == []


def test_a_fork_server_that_dies_costs_an_infrastructure_error_and_is_restarted():
  _judged(BODIES["pass"])
  [server] = [s for s in _servers() if s.alive()]
  result = {}
  runner = threading.Thread(target=lambda: result.update(
      r=sandbox.run_python("import time\ntime.sleep(3)\n", sandbox.SandboxLimits(timeout_s=6.0))))
  runner.start()
  time.sleep(0.7)   # R is running the sample
  os.kill(server.pid, signal.SIGKILL)
  runner.join()
  assert result["r"].infra_error and not result["r"].passed, result["r"]
  after = _judged(BODIES["pass"])
  assert after.passed, after
  assert [s.pid for s in _servers()] != [server.pid]


# Run in a process of its own (a pytest worker may hold JAX's threads, which fork does not copy):
# one judged run, a fork whose child runs two more and reports its server's pid, then one more
# run in the parent. Prints "<child ok> <child's F> <parent's F before> <parent's F after> <ok>".
_FORKED_LAUNCHER = textwrap.dedent("""
    import os
    from orl_sandbox import forkserver
    from orl_sandbox import launcher as sandbox
    PRELUDE, TESTS = {prelude!r}, {tests!r}
    judged = lambda body: sandbox.run_judged(PRELUDE + body, "add", TESTS, PRELUDE,
                                             sandbox.SandboxLimits(timeout_s=3.0))
    server = lambda: list(forkserver._SERVERS.values())[0].pid
    assert judged("  return a + b\\n").passed
    before = server()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
      code = 1
      try:
        ok = judged("  return a + b\\n").passed and judged("  return a - b\\n").verdict == "fail"
        os.write(write, f"{{int(ok)}} {{server()}}".encode())
        code = 0
      finally:
        os._exit(code)
    os.close(write)
    child = os.read(read, 100).decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    print(child, before, server(), int(judged("  return a + b\\n").passed))
    """)


def test_a_forked_launcher_starts_its_own_fork_server():
  """A child forked from a launcher process does not share the parent's server (their requests
  would interleave on one pipe): it starts its own, and the parent's keeps working."""
  script = _FORKED_LAUNCHER.format(prelude=PRELUDE, tests=TESTS)
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  child_ok, child_server, before, after, parent_ok = out.stdout.split()
  assert child_ok == "1" and parent_ok == "1"
  assert child_server != before and after == before


def test_a_spec_path_longer_than_the_slot_starts_a_fresh_runner(monkeypatch, private_tmp):
  deep = private_tmp
  for i in range(5):
    deep = deep / (f"{i}" * 250)
  deep.mkdir(parents=True)
  for directory in [deep, *list(deep.parents)[:4]]:   # the sample's uid traverses them
    os.chmod(directory, 0o755)
  monkeypatch.setenv("TMPDIR", str(deep))
  monkeypatch.setattr(sandbox.tempfile, "tempdir", str(deep))

  def refuse(*args):
    raise AssertionError("the fork server was asked for a run whose spec does not fit")

  monkeypatch.setattr(forkserver, "server_for", refuse)
  assert _judged(BODIES["pass"]).passed
