"""The "sample" isolation (`task.verify_isolation`, docs/verifier.md#threat-model): a prompt's
samples run side by side, each in its own fresh sandbox, and nothing one sample leaves reaches
another — not one running beside it, and not the next one forked from the same runner fork
server (module state, descriptors, random state, environment, files). And what it leaves open:
the CPU the samples share carries a message between two samples that run at the same time,
measured here, and closed by the "prompt" isolation.

Each carry test has a sender that changes something at load and a receiver that answers right
only if it sees the change; a control runs both in one sample (the receiver then sees it), so
each test can fail.
"""
import random
import sys
import textwrap
import typing

import pytest

from orl_jax.config.sections import VerifyIsolation
from orl_jax.problem import Problem
from orl_jax.verify.humaneval import ISOLATIONS, HumanEvalVerifier
from orl_sandbox import launcher as sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

TIMEOUT_S = 6.0
ANSWER = 7
PROBLEM = Problem("carry", "def answer() -> int:\n", entry_point="answer",
                  tests=f"def check(candidate):\n    assert candidate() == {ANSWER}\n")

# What a sample could leave for the next sample forked from the same server (or for one beside
# it): each sender changes it at load; the receiver sets RECEIVED when it finds it. A receiver
# polls for up to 1.5 s, so that a sender beside it has time to act.
_POLL = "_end = time.monotonic() + 1.5\nwhile time.monotonic() < _end and not RECEIVED:\n"
CARRIERS = {
    "module_state": (
        "import builtins, json, sys\njson.CARRIED = 1\nbuiltins.CARRIED = 1\n"
        "sys.modules['carried_marker'] = json\nsys.path.append('/carried')\n",
        "import builtins, json, sys\n" + _POLL
        + "    RECEIVED = (hasattr(json, 'CARRIED') or hasattr(builtins, 'CARRIED')\n"
          "                or 'carried_marker' in sys.modules or '/carried' in sys.path)\n"
          "    time.sleep(0.02)\n"),
    "descriptors": (
        "import tempfile\n_fd = os.open(tempfile.mkstemp()[1], os.O_RDWR)\n"
        "os.dup2(_fd, 200, inheritable=True)\nos.set_inheritable(_fd, True)\n",
        _POLL + "    for _fd in (200, *range(3, 64)):\n"
                "        try:\n"
                "            RECEIVED = RECEIVED or os.path.basename(os.readlink("
                "f'/dev/fd/{_fd}')).startswith('tmp')\n"
                "        except OSError:\n"
                "            pass\n"
                "    try:\n"
                "        os.fstat(200)\n"
                "        RECEIVED = True\n"
                "    except OSError:\n"
                "        time.sleep(0.02)\n"),
    "random_state": (
        "import random\nrandom.seed(1234)\n",
        "import random\nRECEIVED = random.random() == random.Random(1234).random()\n"),
    "environment": (
        "os.environ['CARRIED'] = '1'\nos.putenv('CARRIED_PUT', '1')\nos.umask(0o077)\n",
        _POLL + "    RECEIVED = 'CARRIED' in os.environ or 'CARRIED_PUT' in os.environ\n"
                "    _mask = os.umask(0)\n    os.umask(_mask)\n"
                "    RECEIVED = RECEIVED or _mask == 0o077\n    time.sleep(0.02)\n"),
    "files": (
        "import tempfile\nfor _dir in (os.getcwd(), tempfile.gettempdir(), '/tmp'):\n"
        "    try:\n"
        "        open(os.path.join(_dir, 'carried'), 'w').close()\n"
        "    except OSError:\n"
        "        pass\n",
        "import tempfile\n" + _POLL
        + "    RECEIVED = any(os.path.exists(os.path.join(_d, 'carried'))\n"
          "                   for _d in (os.getcwd(), tempfile.gettempdir(), '/tmp'))\n"
          "    time.sleep(0.02)\n"),
}


def _sender(change: str, tag: str) -> str:
  return f"    return -1  # {tag}\n\n\nimport os, time\n{change}"


def _receiver(find: str, tag: str) -> str:
  return (f"    return {ANSWER} if RECEIVED else -1  # {tag}\n\n\nimport os, time\n"
          f"RECEIVED = False\n{find}")


def test_the_isolations_are_the_configs_values():
  assert ISOLATIONS == typing.get_args(VerifyIsolation)
  with pytest.raises(ValueError, match="isolation"):
    HumanEvalVerifier(isolation="none")
  with pytest.raises(ValueError, match="slot_s"):
    HumanEvalVerifier(isolation="sample", slot_s=0.25)


@pytest.fixture(scope="module")
def one_at_a_time():
  """Sample isolation with one worker: every sample is forked from the same server, one after
  the other."""
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=TIMEOUT_S), parallelism=1) as verifier:
    yield verifier


@pytest.fixture(scope="module")
def side_by_side():
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=TIMEOUT_S), parallelism=2) as verifier:
    yield verifier


@pytest.mark.parametrize("item", sorted(CARRIERS))
def test_nothing_reaches_the_next_sample_through_the_fork_server(one_at_a_time, item):
  change, find = CARRIERS[item]
  tag = f"next {item} {random.random()}"
  control = _receiver(change + find, tag + " control")   # sender and receiver in one sample
  scores = one_at_a_time.score_batch([PROBLEM] * 3, [_sender(change, tag), _receiver(find, tag),
                                                     control])
  assert scores == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("item", sorted(CARRIERS))
def test_nothing_reaches_a_sample_running_beside(side_by_side, item, judged_spans):
  change, find = CARRIERS[item]
  tag = f"beside {item} {random.random()}"
  scores = side_by_side.score_batch([PROBLEM] * 2, [_sender(change, tag), _receiver(find, tag)])
  assert scores == [0.0, 0.0]
  (_, a, b), (_, c, d) = judged_spans
  assert a < d and c < b, "the two samples of one prompt did not run at the same time"


def test_a_prompts_samples_run_side_by_side(side_by_side, judged_spans):
  """The schedule of "sample" isolation: samples of one prompt start together, up to the
  workers, and all score."""
  tag = random.random()
  slow = f"    return {ANSWER}\n\n\nimport time\ntime.sleep(0.5)  # {tag} "
  assert side_by_side.score_batch([PROBLEM] * 4, [slow + str(i) for i in range(4)]) == [1.0] * 4
  (_, a, b), (_, c, d) = sorted(judged_spans, key=lambda span: span[1])[:2]
  assert a < d and c < b


# ------------------------------------------------------------------ the channel that stays open

# Two samples of one prompt that run at the same time share the machine's CPUs. The sender knows
# the answer (8 bits); it pins itself to CPU 0 and, in each 50 ms window of the wall clock
# (CLOCK_REALTIME is not namespaced), busy-loops for a 1 bit and sleeps for a 0, the byte
# repeated for 2 s; the receiver pins itself to CPU 0 too and counts its own loop's turns per
# window: fewer turns, a 1. Windows are fixed by the wall clock, so no start needs to agree.
_WINDOW_S, _SPAN_S = 0.05, 2.0
_CONTENTION_SENDER = textwrap.dedent(f"""\
    return -1


import os, time
BITS = {{bits}}  # {{tag}}
try:
    os.sched_setaffinity(0, {{{{0}}}})
except OSError:
    pass
_end = time.time() + {_SPAN_S}
while time.time() < _end:
    _t = time.time()
    if not BITS[int(_t / {_WINDOW_S}) % 8]:
        time.sleep({_WINDOW_S} - _t % {_WINDOW_S})
""")
_CONTENTION_RECEIVER = textwrap.dedent(f"""\
    return DECODED


import os, time
try:
    os.sched_setaffinity(0, {{{{0}}}})
except OSError:
    pass
_counts = [0] * 8
_end = time.time() + {_SPAN_S}
while time.time() < _end:
    _counts[int(time.time() / {_WINDOW_S}) % 8] += 1
_middle = sum(sorted(_counts)[3:5]) / 2
DECODED = sum(1 << i for i, c in enumerate(_counts) if c < _middle)  # {{tag}}
""")


def _contention_trials(verifier, trials: int) -> int:
  """Trials of a sender, a receiver and an honest sample of one prompt whose answer is a random
  byte with four bits set: how many receivers answered the byte."""
  right = 0
  for trial in range(trials):
    bits = [1] * 4 + [0] * 4
    random.shuffle(bits)
    secret, tag = sum(b << i for i, b in enumerate(bits)), f"{trial} {random.random()}"
    problem = Problem(f"byte {tag}", "def secret() -> int:\n", entry_point="secret",
                      tests=f"def check(candidate):\n    assert candidate() == {secret}\n")
    scores = verifier.score_batch([problem] * 3, [
        "    " + _CONTENTION_SENDER.format(bits=bits, tag=tag).lstrip(),
        "    " + _CONTENTION_RECEIVER.format(tag=tag).lstrip(),
        f"    return {secret}  # {tag}\n"])
    assert scores[0] == 0.0 and scores[2] == 1.0, scores
    right += int(scores[1])
  return right


def test_prompt_isolation_closes_the_cpu_channel():
  """With `isolation="prompt"` the receiver runs after the sender: it reads only its own
  windows and answers the byte by chance (1 in 70)."""
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=TIMEOUT_S), parallelism=3,
                         isolation="prompt") as verifier:
    assert _contention_trials(verifier, trials=2) == 0


@pytest.mark.slow
def test_the_cpu_channel_between_side_by_side_samples_is_measured(record_property):
  """The channel "sample" isolation leaves open, measured (not asserted closed): how many of
  six receivers decoded their sender's byte (8 bits in 2 s; docs/verifier.md quotes it)."""
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=TIMEOUT_S), parallelism=3) as verifier:
    right = _contention_trials(verifier, trials=6)
  record_property("bytes_decoded_of_6", right)
  print(f"cpu channel, sample isolation: {right} of 6 bytes decoded (8 bits a pair each)")
  assert 0 <= right <= 6


def test_training_verifies_code_with_the_task_isolation(tmp_path):
  import json
  from configs import tiny
  from orl_jax.errors import ConfigError
  from orl_jax.tasks import get_task
  path = tmp_path / "code.jsonl"
  path.write_text(json.dumps({"id": "answer", "prompt": PROBLEM.prompt, "entry_point": "answer",
                              "tests": PROBLEM.tests}) + "\n")
  c = tiny.get_config("smoke")
  c.task.name, c.task.path = "jsonl", str(path)
  for isolation in (None, "prompt"):
    if isolation is not None:
      c.task.verify_isolation = isolation
    task = get_task(c.task)
    assert task.verifier.code.inner.isolation == (isolation or "sample")   # the default
    task.verifier.code.inner.close()
  c.task.verify_isolation = "none"
  with pytest.raises(ConfigError, match=r"task.verify_isolation='none' must be one of"):
    get_task(c.task)
