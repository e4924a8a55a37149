"""The sandbox holds against hostile completions (DESIGN §5 "Sandboxed execution").

Each hostile completion is written so that it would *pass* if the attack worked: a score of 0
therefore shows the attack failed, not merely that the sample crashed for another reason.
"""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from orl_jax.verify import sandbox
from orl_jax.verify.base import Problem
from orl_jax.verify.humaneval import HumanEvalVerifier

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

TIMEOUT_S = 3.0
SLACK_S = 5.0   # launch + kill + reap on a loaded 2-core machine
ADD = Problem(problem_id="add", prompt="def add(a, b):\n",
              tests="def check(candidate):\n  assert candidate(2, 3) == 5\n", entry_point="add")
SECRET = "orl-test-secret-5f1c2d"


@pytest.fixture
def verifier():
  """A fresh verifier per test, so no test reads another's cached scores."""
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=TIMEOUT_S), parallelism=2) as v:
    yield v


@pytest.fixture(scope="module")
def isolation():
  return sandbox.probe_isolation()


@pytest.fixture
def canary(tmp_path):
  path = tmp_path / "canary.txt"
  path.write_text("still here")
  return path


def _sandbox_processes() -> list[int]:
  """Pids of live (non-zombie) processes running the sandbox runner."""
  runner = pathlib.Path(sandbox.__file__).resolve().as_posix().encode()
  pids = []
  for entry in pathlib.Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      if runner in (entry / "cmdline").read_bytes() and b"\nState:\tZ" not in (
          entry / "status").read_bytes():
        pids.append(int(entry.name))
    except OSError:
      continue
  return pids


def _score_alone(verifier, completion: str) -> tuple[float, float]:
  start = time.monotonic()
  [score] = verifier.score_batch([ADD], [completion])
  return score, time.monotonic() - start


def test_honest_completion_passes_and_is_cached(verifier):
  score, _ = _score_alone(verifier, "  return a + b\n")
  assert score == 1.0
  score, seconds = _score_alone(verifier, "  return a + b\n")
  assert score == 1.0 and seconds < 0.05   # cache hit: no process started


def test_wrong_and_early_exit_completions_fail(verifier):
  completions = ["  return a - b\n",
                 "  import os; os._exit(0)\n",          # exits 0 before the tests run
                 "  import sys; sys.exit(0)\n",
                 "  return a + b\n" + ")syntax error(\n"]
  assert verifier.score_batch([ADD] * 4, completions) == [0.0] * 4


def test_infinite_loop_times_out(verifier):
  start = time.monotonic()
  result = verifier.run(ADD, "  while True:\n    pass\n")
  assert result.timed_out and not result.passed
  assert time.monotonic() - start < TIMEOUT_S + SLACK_S


def test_fork_bomb_is_contained(verifier):
  bomb = ("  import os\n  while True:\n    try:\n      os.fork()\n    except OSError:\n"
          "      pass\n")
  score, seconds = _score_alone(verifier, bomb)
  assert score == 0.0 and seconds < TIMEOUT_S + SLACK_S
  deadline = time.monotonic() + 5.0
  while _sandbox_processes() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert _sandbox_processes() == []


def test_fork_bomb_does_not_starve_concurrent_samples(verifier):
  bomb = "  import os\n  while True:\n    try:\n      os.fork()\n    except OSError:\n      pass\n"
  hog = "  x = bytearray(8 * 1024 ** 3)\n  return a + b\n"
  scores = verifier.score_batch([ADD] * 4, [bomb, "  return b + a\n", hog, "  return a + b  \n"])
  assert scores == [0.0, 1.0, 0.0, 1.0]


def test_memory_bomb_fails(verifier):
  # Would pass if RLIMIT_AS were missing (a lazily zeroed 8 GiB buffer costs no real memory).
  score, _ = _score_alone(verifier, "  x = bytearray(8 * 1024 ** 3)\n  return a + b\n")
  assert score == 0.0
  score, _ = _score_alone(verifier, "  x = []\n  while True:\n    x.append(bytearray(10 ** 7))\n")
  assert score == 0.0


def test_deleting_files_outside_the_sandbox_fails(verifier, canary):
  attacks = [f"  import os\n  os.remove({str(canary)!r})\n  return a + b\n",
             f"  import shutil\n  shutil.rmtree({str(canary.parent)!r})\n  return a + b\n",
             f"  open({str(canary)!r}, 'w').write('overwritten')\n  return a + b\n",
             "  import os, shutil\n  shutil.rmtree(os.getcwd())\n"
             "  assert not os.path.exists(os.getcwd())\n  return a + b\n",
             "  import os\n  os.rename(os.getcwd(), os.getcwd() + '_moved')\n  return a + b\n"]
  before = set(pathlib.Path(tempfile.gettempdir()).glob("orl_sandbox_*"))
  assert verifier.score_batch([ADD] * len(attacks), attacks) == [0.0] * len(attacks)
  assert canary.read_text() == "still here"
  after = set(pathlib.Path(tempfile.gettempdir()).glob("orl_sandbox_*"))
  assert after <= before   # every sandbox directory was cleaned up


def test_huge_file_is_capped(verifier):
  writer = ("  with open('big.bin', 'wb') as f:\n    for _ in range(64):\n"
            "      f.write(b'0' * (1 << 20))\n  return a + b\n")
  assert _score_alone(verifier, writer)[0] == 0.0
  result = verifier.run(ADD, writer)
  assert "File too large" in result.stderr


def test_writing_outside_the_sandbox_directory_fails(verifier, isolation):
  if "landlock-fs" not in isolation:
    pytest.skip(f"no Landlock on this machine ({isolation}): world-writable dirs stay writable")
  target = pathlib.Path(tempfile.gettempdir()) / f"orl_sandbox_escape_{os.getpid()}"
  attack = f"  open({str(target)!r}, 'w').write('x')\n  return a + b\n"
  try:
    assert _score_alone(verifier, attack)[0] == 0.0
    assert not target.exists()
  finally:
    target.unlink(missing_ok=True)


def test_parent_secrets_are_invisible(verifier, monkeypatch, tmp_path):
  monkeypatch.setenv("ORL_TEST_SECRET", SECRET)
  secret_file = tmp_path / "secret.txt"
  secret_file.write_text(SECRET)
  parent = os.getpid()
  readers = [
      f"  assert open({str(secret_file)!r}).read() == {SECRET!r}\n  return a + b\n",
      f"  import os\n  assert os.environ.get('ORL_TEST_SECRET') == {SECRET!r}\n  return a + b\n",
      # The launcher's (pytest's) own environ file, by pid.
      f"  data = open('/proc/{parent}/environ', 'rb').read()\n"
      f"  assert {SECRET.encode()!r} in data\n  return a + b\n",
      # Any process on the machine whose environment holds the secret.
      "  import os\n  found = False\n  for pid in os.listdir('/proc'):\n    try:\n"
      f"      found |= {SECRET.encode()!r} in open(f'/proc/{{pid}}/environ', 'rb').read()\n"
      "    except OSError:\n      pass\n  assert found\n  return a + b\n",
  ]
  assert verifier.score_batch([ADD] * len(readers), readers) == [0.0] * len(readers)
  printed = verifier.run(ADD, "  import os\n  print(dict(os.environ))\n  return a + b\n")
  assert printed.passed and SECRET not in printed.stdout and "ORL_TEST_SECRET" not in printed.stdout


def test_network_is_unreachable(verifier, isolation):
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  server.setblocking(False)
  port = server.getsockname()[1]
  attacks = [
      f"  import socket\n  socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
      "  return a + b\n",
      f"  import socket\n  s = socket.socket()\n  s.bind(('127.0.0.1', 0))\n  s.listen()\n"
      "  return a + b\n",
  ]
  if {"netns", "landlock-net"} & set(isolation):
    # Raw libc calls bypass the `socket` module patch: only the kernel layers stop these.
    attacks.append(
        "  import ctypes, struct\n  libc = ctypes.CDLL(None, use_errno=True)\n"
        "  fd = libc.socket(2, 1, 0)\n"
        f"  addr = struct.pack('=H', 2) + struct.pack('!H4s8x', {port}, bytes([127, 0, 0, 1]))\n"
        "  assert libc.connect(fd, addr, len(addr)) == 0\n  return a + b\n")
  try:
    assert verifier.score_batch([ADD] * len(attacks), attacks) == [0.0] * len(attacks)
    with pytest.raises(BlockingIOError):
      server.accept()   # nothing ever reached the parent's server
  finally:
    server.close()


def test_processes_outside_cannot_be_signalled(verifier):
  victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    attack = (f"  import os, signal\n  os.kill({victim.pid}, signal.SIGKILL)\n"
              f"  os.kill({os.getpid()}, signal.SIGKILL)\n  return a + b\n")
    assert _score_alone(verifier, attack)[0] == 0.0
    assert victim.poll() is None
  finally:
    victim.send_signal(signal.SIGKILL)
    victim.wait()


def test_result_record_and_limits():
  limits = sandbox.SandboxLimits(timeout_s=TIMEOUT_S, max_output_bytes=1000)
  result = sandbox.run_python("import sys\nprint('x' * 5000)\nprint('err', file=sys.stderr)\n",
                              limits)
  assert result.passed and not result.timed_out and result.returncode == 0
  assert result.stdout == "x" * 1000 and result.stderr == "err\n"
  assert {"rlimits", "socket-patch"} <= set(result.isolation)
  failed = sandbox.run_python("raise ValueError('boom')\n", limits)
  assert not failed.passed and failed.returncode == 1 and "ValueError: boom" in failed.stderr
  # stdin is closed: reading it gives EOF at once instead of blocking until the timeout.
  eof = sandbox.run_python("import sys\nassert sys.stdin.read() == ''\n", limits)
  assert eof.passed


def test_isolation_layers_on_linux(isolation):
  """Reports what this machine enforces; the kernel layers are expected on the CI machine."""
  print(f"sandbox isolation layers: {isolation}")
  assert {"rlimits", "socket-patch"} <= set(isolation)
  if os.geteuid() == 0:
    assert f"uid:{sandbox.SANDBOX_UID}" in isolation   # root ignores RLIMIT_NPROC otherwise
