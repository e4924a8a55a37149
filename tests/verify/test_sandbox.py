"""The sandbox holds against hostile completions (docs/verifier.md#threat-model).

Each hostile completion is written so that it would *pass* if the attack worked: a score of 0
therefore shows the attack failed, not merely that the sample crashed for another reason. The
adversarial suite through the training loop's verifier stack is `test_sandbox_attacks.py`; this
file covers the sandbox's own API, its layers, the codec and the cleanup.
"""
import collections
import datetime
import decimal
import enum
import fractions
import json
import dataclasses
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from orl_jax.verify import humaneval
from orl_sandbox import launcher as sandbox
from orl_sandbox import syscalls, wire
from orl_jax.problem import Problem
from orl_jax.verify.humaneval import HumanEvalVerifier
from tests.support.sandbox import sandbox_processes

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
  result = verifier.run(ADD, "  return a - b\n")
  assert result.verdict == "fail" and "AssertionError" in result.detail


def test_infinite_loop_times_out(verifier):
  start = time.monotonic()
  result = verifier.run(ADD, "  while True:\n    pass\n")
  assert result.timed_out and not result.passed
  assert time.monotonic() - start < TIMEOUT_S + SLACK_S


def test_fork_bomb_is_contained(private_tmp, verifier):
  bomb = ("  import os\n  while True:\n    try:\n      os.fork()\n    except OSError:\n"
          "      pass\n")
  score, seconds = _score_alone(verifier, bomb)
  assert score == 0.0 and seconds < TIMEOUT_S + SLACK_S
  deadline = time.monotonic() + 5.0
  while sandbox_processes(private_tmp) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert sandbox_processes(private_tmp) == []


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


def test_deleting_files_outside_the_sandbox_fails(private_tmp, verifier, canary):
  attacks = [f"  import os\n  os.remove({str(canary)!r})\n  return a + b\n",
             f"  import shutil\n  shutil.rmtree({str(canary.parent)!r})\n  return a + b\n",
             f"  open({str(canary)!r}, 'w').write('overwritten')\n  return a + b\n",
             "  import os, shutil\n  shutil.rmtree(os.getcwd())\n"
             "  assert not os.path.exists(os.getcwd())\n  return a + b\n",
             "  import os\n  os.rename(os.getcwd(), os.getcwd() + '_moved')\n  return a + b\n"]
  before = set(private_tmp.glob("orl_sandbox_*"))
  assert verifier.score_batch([ADD] * len(attacks), attacks) == [0.0] * len(attacks)
  assert canary.read_text() == "still here"
  after = set(private_tmp.glob("orl_sandbox_*"))
  assert after <= before   # every sandbox directory was cleaned up


def test_huge_file_is_capped(verifier):
  writer = ("  with open('big.bin', 'wb') as f:\n    for _ in range(64):\n"
            "      f.write(b'0' * (1 << 20))\n  return a + b\n")
  assert _score_alone(verifier, writer)[0] == 0.0
  result = verifier.run(ADD, writer)
  # the candidate's OSError (errno EFBIG), which crosses as its class only
  assert result.detail == "OSError", result.detail


def test_writes_outside_the_sandbox_never_reach_the_host(verifier, isolation):
  target = pathlib.Path(tempfile.gettempdir()) / f"orl_sandbox_escape_{os.getpid()}"
  attack = (f"  open({str(target)!r}, 'w').write('x')\n"
            "  open('/usr/orl_escape', 'w').write('x')\n  return a + b\n")
  try:
    assert _score_alone(verifier, attack)[0] == 0.0   # /usr is read-only in there
    assert not target.exists() and not os.path.exists("/usr/orl_escape")
    # With a private root, the sample's /tmp is its own tmpfs: the write lands there.
    private = f"  open({str(target)!r}, 'w').write('x')\n  return a + b\n"
    assert _score_alone(verifier, private)[0] == (1.0 if "mountns" in isolation else 0.0)
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
      "  import socket\n  s = socket.socket()\n  s.bind(('127.0.0.1', 0))\n  s.listen()\n"
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
  assert result.verdict == "pass" and result.infra_error is None
  assert "rlimits" in result.isolation
  failed = sandbox.run_python("raise ValueError('boom')\n", limits)
  assert not failed.passed and failed.returncode == 1 and "ValueError: boom" in failed.stderr
  # stdin is closed: reading it gives EOF at once instead of blocking until the timeout.
  eof = sandbox.run_python("import sys\nassert sys.stdin.read() == ''\n", limits)
  assert eof.passed
  # run_python's verdict is the program's own exit status (never used to score samples).
  assert sandbox.run_python("import sys\nsys.exit(3)\n", limits).returncode == 3


def test_isolation_layers_on_linux(isolation):
  """Reports what this machine enforces; the essential layers are expected here as root."""
  print(f"sandbox isolation layers: {isolation}")
  assert "rlimits" in isolation
  if os.geteuid() == 0:
    assert any(layer.startswith("uid:") for layer in isolation), isolation
    assert sandbox.missing_essentials(isolation) == [], isolation


# ----------------------------------------------------------------------------- syscall filter

_HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
            "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", sorted(_HEADERS))
def test_syscall_numbers_match_the_kernel_headers(machine):
  """Every number in the filter's tables is the C headers' (where they are installed)."""
  path = pathlib.Path(_HEADERS[machine])
  if not path.exists():
    pytest.skip(f"{path} is not installed")
  text = path.read_text()
  headers = {name: int(nr) for name, nr in re.findall(r"#define __NR3?2?6?4?_(\w+)\s+(\d+)",
                                                      text)}
  headers["newfstatat"] = headers.get("newfstatat", headers.get("fstatat"))
  table = syscalls.numbers(machine)
  compared = {name: nr for name, nr in table.items() if name in headers}
  assert compared == {name: headers[name] for name in compared}
  assert len(compared) > 0.9 * len(table)   # the rest are newer than these headers
  names = syscalls.ALLOWED + list(syscalls.CHECKED) + list(syscalls.NOT_IMPLEMENTED)
  assert len(set(names + syscalls.DENIED)) == len(names) + len(syscalls.DENIED)
  assert syscalls.program(machine)   # every jump is within reach


def test_syscall_filter_allows_denies_and_answers_enosys():
  """What a survey of the filter promises: Python's own work runs; machine-wide resources and
  counters are refused with EPERM; a call the tables do not know (a newer kernel's) is ENOSYS."""
  program = textwrap.dedent(f"""\
      import ctypes, errno, json, mmap, os, threading
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      def attempt(nr, *args):
          return errno.errorcode.get(ctypes.get_errno(), "?") if libc.syscall(nr, *args) < 0 \
              else "ok"
      worker = threading.Thread(target=lambda: None)
      worker.start()
      worker.join()
      with open("f", "w") as f:
          f.write("x")
      private = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)
      result = {{"io_setup": attempt({syscalls.numbers(os.uname().machine)["io_setup"]}, 1,
                                       ctypes.byref(ctypes.c_ulong(0))),
                "sysinfo": attempt({syscalls.numbers(os.uname().machine)["sysinfo"]},
                                   ctypes.create_string_buffer(256)),
                "unknown": attempt(470), "proc": os.path.exists("/proc/self"),
                "zero": os.path.exists("/dev/zero")}}
      try:
          mmap.mmap(-1, 4096)   # shared and anonymous
      except OSError as error:
          result["shared_mmap"] = errno.errorcode[error.errno]
      try:
          os.pipe()
      except OSError as error:
          result["pipe"] = errno.errorcode[error.errno]
      print(json.dumps(result))
      """)
  result = sandbox.run_python(program, sandbox.SandboxLimits(timeout_s=TIMEOUT_S))
  assert result.passed, result.stderr
  assert json.loads(result.stdout) == {"io_setup": "EPERM", "sysinfo": "EPERM",
                                       "unknown": "ENOSYS", "proc": False, "zero": False,
                                       "shared_mmap": "EPERM", "pipe": "EPERM"}


def test_a_prompt_is_claimed_machine_wide():
  """Two processes never hold one prompt's claim at once (samples of one prompt never run side
  by side, also across verifiers of different processes on one machine)."""
  fd = sandbox.claim_exclusive("prompt under test")
  if fd == -1:
    pytest.skip("no lock directory on this machine (the claim is per process)")
  try:
    assert fd is not None
    other = ("import sys\nfrom orl_sandbox import launcher\n"
             "fd = launcher.claim_exclusive(sys.argv[1])\nsys.exit(0 if fd is None else 1)\n")
    assert subprocess.run([sys.executable, "-c", other, "prompt under test"]).returncode == 0
  finally:
    sandbox.release_exclusive(fd)
  assert subprocess.run([sys.executable, "-c", other, "prompt under test"]).returncode == 1


# ----------------------------------------------------------------------------- refusal, opt-out


def test_missing_essential_layer_refuses_to_run(tmp_path):
  canary = tmp_path / "ran"
  program = f"open({str(canary)!r}, 'w').write('ran')\n"
  limits = sandbox.SandboxLimits(timeout_s=TIMEOUT_S, skip_layers=("netns",))
  with pytest.raises(sandbox.SandboxUnavailableError, match="network namespace"):
    sandbox.run_python(program, limits)
  with pytest.raises(sandbox.SandboxUnavailableError, match="require_isolation=False"):
    with HumanEvalVerifier(limits) as weak:
      weak.score_batch([ADD], ["  return a + b\n"])
  assert not canary.exists()


def test_explicit_opt_out_runs_with_weaker_layers(monkeypatch, private_tmp):
  """Without the private root the sample works in a host directory; a tree deeper than the
  recursion limit and locked directories left there are still removed, and nothing raises."""
  tree = ("import os\nfor _ in range(1100):\n  os.mkdir('d')\n  os.chdir('d')\n"
          "os.chdir(os.environ['HOME'])\nos.mkdir('locked')\nopen('locked/f', 'w').write('x')\n"
          "os.chmod('locked', 0)\nos.symlink('/etc', 'link')\n")
  before = set(private_tmp.glob("orl_sandbox_*"))
  limits = sandbox.SandboxLimits(timeout_s=TIMEOUT_S + 5, skip_layers=("mountns",),
                                 require_isolation=False)
  result = sandbox.run_python(tree, limits)
  assert result.passed, result
  assert "mountns" not in result.isolation
  monkeypatch.setenv(sandbox.ALLOW_WEAK_ENV, "1")
  weak = dataclasses.replace(limits, require_isolation=True)
  assert sandbox.run_python("pass\n", weak).passed
  after = set(private_tmp.glob("orl_sandbox_*"))
  assert after <= before
  assert os.path.isdir("/etc")


def test_remove_tree_handles_depth_locks_and_symlinks(tmp_path):
  if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
    tmp_path = pathlib.Path(tempfile.mkdtemp(dir="/dev/shm"))   # fast to fill and empty
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "keep").write_text("keep")
  root = tmp_path / "tree"
  root.mkdir()
  fd = os.open(root, os.O_RDONLY)
  for _ in range(3000):   # deeper than PATH_MAX allows as one path
    os.mkdir("d", dir_fd=fd)
    next_fd = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = next_fd
  os.close(fd)
  (root / "locked").mkdir()
  (root / "locked" / "f").write_text("x")
  os.chmod(root / "locked", 0)
  os.symlink(outside, root / "link")
  os.symlink(outside / "keep", root / "file_link")
  assert sandbox.remove_tree(str(root))
  assert not root.exists()
  assert (outside / "keep").read_text() == "keep"
  assert sandbox.remove_tree(str(tmp_path / "missing"))
  assert sandbox.remove_tree(str(tmp_path))


# ----------------------------------------------------------------------------- judge protocol


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 1 << 80, -(1 << 70), 0.5, -0.0, float("inf"), float("-inf"), "",
    "h\u00e9llo\x00", b"\x00\xff", bytearray(b"\x01"), 1 + 2j, [], [1, [2, (3,)]], (),
    (1, "a", None), {1, 2}, frozenset({"a"}), {}, {"a": 1, 2: [3], (4, 5): frozenset({6})},
    [True, 1, 1.0], fractions.Fraction(-3, 4), decimal.Decimal("-1.50"),
])
def test_wire_round_trips_exact_types(value):
  message = wire.loads(wire.dumps({"v": wire.encode(value)})[4:])
  decoded = wire.decode(message["v"])
  assert decoded == value and type(decoded) is type(value)
  assert repr(decoded) == repr(value)


def test_wire_nan_and_bare_constants():
  nan = wire.decode(wire.encode(float("nan")))
  assert nan != nan
  with pytest.raises(wire.WireError):
    wire.loads(b'{"v": NaN}')
  with pytest.raises(wire.WireError):
    wire.loads(b'[1]')


def test_wire_values_are_trees():
  """No identity crosses: a shared part arrives as two copies, every decode builds new
  objects, and a value that contains itself is not data."""
  inner = [0]
  decoded = wire.decode(wire.encode([inner, inner]))
  assert decoded == [[0], [0]] and decoded[0] is not decoded[1]
  decoded[0].append(1)
  assert decoded[1] == [0] and inner == [0]
  cycle: list = []
  cycle.append(cycle)
  with pytest.raises(wire.WireError, match="containing itself"):
    wire.encode(cycle)
  with pytest.raises(wire.WireError, match="parts"):   # aliases expand past the cap
    wire.encode([[[0] * 2048] * 2048] * 2)


class _SubInt(int):
  pass


class _Point:
  def __init__(self):
    self.x = 1


@pytest.mark.parametrize("value", [
    _SubInt(3), object(), len, lambda: 0, _Point(), [object()], {"k": object()}, pathlib,
    type("F", (float,), {})(1.0), slice(1), _Point, range(3), iter([1]), (x for x in [1]),
    collections.namedtuple("P", "x")(1), collections.Counter("ab"), re.match("a", "a"),
    time.gmtime(0), enum.Enum("E", "A").A, collections.OrderedDict(), Ellipsis, ValueError(),
    memoryview(b"a"), datetime.date(2020, 1, 1),
])
def test_wire_rejects_everything_else(value):
  with pytest.raises(wire.WireError, match="not plain data"):
    wire.encode(value)


@pytest.mark.parametrize("data", [
    {"$bytes": "***"}, {"$x": []}, {"a": 1}, {"$float": "1.5"}, {"$complex": [1, 2]},
    {"$tuple": 3}, {"$set": [[1]]}, {"$dict": [[[1], 2]]}, {"$dict": [[1]]}, {"$int": 5},
    {"$fraction": [1, 0]}, {"$fraction": [1.0, 2]}, {"$decimal": 1}, {"$tuple": [], "x": 1},
    {"$ref": 0}, {"$type": ["os", "system"]},
])
def test_wire_decoder_rejects_malformed_data(data):
  with pytest.raises(wire.WireError):
    wire.decode(data)


def test_judged_run_records_the_protocol():
  limits = sandbox.SandboxLimits(timeout_s=TIMEOUT_S)
  tests = ("def check(candidate):\n  assert candidate((1, 2), b=[3]) == ((1, 2), [3])\n"
           "  try:\n    candidate(None, b=0)\n  except ZeroDivisionError:\n    pass\n"
           "  else:\n    assert False\n")
  good = "def f(a, b):\n  if b == 0:\n    return 1 / b\n  return a, b\n"
  result = sandbox.run_judged(good, "f", tests, limits=limits)
  assert result.passed and result.detail == "2 calls" and "judge-process" in result.isolation
  # A non-data answer is a protocol violation that `except` in the tests cannot swallow.
  sly = "def f(a, b):\n  return lambda: a\n"
  catching = ("def check(candidate):\n  try:\n    candidate(1, b=2)\n"
              "  except BaseException:\n    pass\n")
  result = sandbox.run_judged(sly, "f", catching, limits=limits)
  assert not result.passed and "not plain data" in result.detail
  # A candidate raising StopIteration must not end the tests' loop over `map(candidate, ...)`:
  # it crosses as a RuntimeError.
  stopper = "def f(a, b):\n  raise StopIteration\n"
  looping = "def check(candidate):\n  for got in map(candidate, [1], [2]):\n    assert got == 3\n"
  result = sandbox.run_judged(stopper, "f", looping, limits=limits)
  assert not result.passed and "RuntimeError" in result.detail
  missing = sandbox.run_judged("def g():\n  pass\n", "f", tests, limits=limits)
  assert not missing.passed and "did not load" in missing.detail


def test_prompt_helpers_run_in_the_judge():
  prompt = 'def helper(x):\n  return 2 * x\n\ndef f(x):\n  "Doubles x."\n'
  tests = "def check(candidate):\n  assert helper(candidate(3)) == 12\n"
  result = sandbox.run_judged(prompt + "  return 2 * x\n", "f", tests, prelude=prompt,
                              limits=sandbox.SandboxLimits(timeout_s=TIMEOUT_S))
  assert result.passed, result


# ----------------------------------------------------------------------------- caching


def _fake_result(**overrides):
  fields = dict(passed=False, timed_out=False, returncode=None, stdout="", stderr="",
                isolation=(), wall_s=0.0, verdict="fail", detail="", infra_error=None)
  fields.update(overrides)
  return sandbox.SandboxResult(**fields)


def test_infrastructure_failures_are_never_cached_and_timeouts_once_twice(verifier,
                                                                           monkeypatch):
  calls = []
  outcomes = iter([
      _fake_result(verdict="", infra_error="fork failed"),      # first try fails ...
      _fake_result(verdict="", infra_error="fork failed"),      # ... and its retry too
      _fake_result(passed=True, verdict="pass"),                # next batch: a real verdict
      _fake_result(timed_out=True, verdict=""),                 # another sample times out
      _fake_result(passed=True, verdict="pass"),                # and passes next time
      _fake_result(timed_out=True, verdict=""),                 # a sleeper times out ...
      _fake_result(timed_out=True, verdict=""),                 # ... twice: cached as 0
  ])

  def fake_judge_run(problem, completion, limits):
    calls.append(completion)
    return next(outcomes)

  verifier.score_batch([ADD], ["  return a + b\n"])   # the smoke check runs for real first
  monkeypatch.setattr(humaneval, "judge_run", fake_judge_run)
  monkeypatch.setattr(humaneval.time, "sleep", lambda seconds: None)
  honest = "  return a + b  # uncached\n"
  assert verifier.score_batch([ADD], [honest]) == [0.0]
  assert verifier.score_batch([ADD], [honest]) == [1.0]   # not served from the cache
  assert verifier.score_batch([ADD], [honest]) == [1.0]   # now cached: no new run
  slow = "  return a + b  # slow\n"
  assert verifier.score_batch([ADD], [slow]) == [0.0]
  assert verifier.score_batch([ADD], [slow]) == [1.0]
  sleeper = "  import time\n  time.sleep(60)\n"
  assert [verifier.score_batch([ADD], [sleeper]) for _ in range(3)] == [[0.0]] * 3
  assert len(calls) == 7   # the third submission of the sleeper came from the cache
  assert (verifier.stats.infra_errors, verifier.stats.timeouts,
          verifier.stats.timeouts_cached) == (2, 3, 1)


def test_a_run_that_records_no_verdict_is_an_infrastructure_failure(monkeypatch, tmp_path):
  """A runner that ends without a verdict (its status file could not be written, say) says
  nothing about the sample: never a 0."""
  silent = tmp_path / "silent_runner.py"
  silent.write_text("import sys\nsys.exit(0)\n")
  monkeypatch.setattr(sandbox, "RUNNER_PATH", str(silent))
  result = sandbox.run_judged(   # R started as this script (a fork server would run it as F)
      "def add(a, b):\n  return a + b\n", "add", ADD.tests,
      limits=sandbox.SandboxLimits(timeout_s=TIMEOUT_S, fork_server=False))
  assert not result.passed and result.verdict == ""
  assert result.infra_error and "no verdict" in result.infra_error


def test_full_host_disk_is_never_a_cached_zero(monkeypatch, tmp_path_factory):
  """The launcher's temporary directory fills up (as a neighbour's fallocate on an inherited
  stdout once did): an honest sample whose run cannot record its verdict is not scored 0 for it,
  and scores 1 once there is room again."""
  if os.geteuid() != 0:
    pytest.skip("mounts a small tmpfs (root only)")
  tmp_path_factory.getbasetemp()
  root = pathlib.Path(tempfile.mkdtemp(prefix="orl_test_full_"))
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=755", "tmpfs", str(root)],
                    capture_output=True).returncode != 0:
    root.rmdir()
    pytest.skip("cannot mount a tmpfs here")
  try:
    with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=TIMEOUT_S), parallelism=1) as v:
      assert v.score_batch([ADD], ["  return b + a\n"]) == [1.0]   # smoke check passed
      monkeypatch.setenv("TMPDIR", str(root))
      monkeypatch.setattr(tempfile, "tempdir", str(root))

      # Full, but for two pages: the launcher's spec and tests fit; the runner's records don't.
      with open(root / "fill", "wb", buffering=0) as f:
        with pytest.raises(OSError):
          while True:
            f.write(b"x" * 4096)
      os.truncate(root / "fill", (root / "fill").stat().st_size - 2 * 4096)
      honest = "  return a + b  # full disk\n"
      assert v.score_batch([ADD], [honest]) == [0.0]
      (root / "fill").unlink()
      assert v.score_batch([ADD], [honest]) == [1.0]   # the 0 was not cached
  finally:
    monkeypatch.undo()
    subprocess.run(["umount", "-l", str(root)], check=False)
    root.rmdir()


def test_teardown_reads_only_a_bounded_prefix_of_each_command_line():
  """A process with a 1.5 MiB command line costs teardown 4 KiB: the run's token is looked for
  only in the first `CMDLINE_PREFIX_BYTES`, where R and I name it."""
  bulk = ["x" * (100 << 10)] * 15
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "near-token"]
                          + bulk + ["far-token"])
  try:
    time.sleep(0.2)
    assert sandbox._cmdline_has(proc.pid, b"near-token")
    assert not sandbox._cmdline_has(proc.pid, b"far-token")
    assert sandbox._kill_cmdline(b"far-token") == []
  finally:
    proc.kill()
    proc.wait()


def test_wire_set_order_depends_on_the_values_only():
  """Two equal sets that iterate differently (one shrunk from a larger table) arrive iterating
  the same way: the sender cannot choose the order a test reads (a str() of a set)."""
  grown = set(range(300))
  for x in range(300):
    if x not in (0, 2, 4, 225):
      grown.discard(x)
  small = {225, 4, 2, 0}
  assert grown == small and list(grown) != list(small)
  for kind in (set, frozenset):
    one, two = wire.decode(wire.encode(kind(grown))), wire.decode(wire.encode(kind(small)))
    assert type(one) is kind and one == two == small and list(one) == list(two)
  big = {10 ** 5000, -1, -2, "x"}   # an int repr refuses; -1 and -2 share a hash
  assert wire.decode(wire.encode(big)) == big
