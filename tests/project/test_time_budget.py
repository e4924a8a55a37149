"""The per-test time budget (tests/support/time_budget.py, docs/testing.md#the-time-budget): a
test of the default suite over its allowance fails with one sentence, a listed or `slow` one
does not, and the allowlist the suite uses names tests that exist."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.support import time_budget

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Budget 0.25 s x tolerance 2 = 0.5 s for a test not listed; sleeps of 1 s are over it by twice
# what a loaded machine adds, the quick test is under it by far.
_TESTS = '''
import time
import pytest

@pytest.fixture
def slow_setup():
  time.sleep(0.4)

def test_quick():
  pass

def test_new_long():
  time.sleep(1.0)

def test_listed_long():
  time.sleep(1.0)

def test_listed_grown():
  time.sleep(1.0)

@pytest.mark.slow
def test_marked_slow():
  time.sleep(1.0)

def test_setup_counts(slow_setup):
  time.sleep(0.4)

def test_long_and_failing():
  time.sleep(1.0)
  assert False, "its own failure"
'''
_KNOWN = '''# measured seconds, test id
0.75 test_budgeted.py::test_listed_long
0.3 test_budgeted.py::test_listed_grown   # listed below what it takes now
'''


def _run_suite(tmp_path, *args):
  """The outcome of each test of _TESTS run by pytest with the budget's hooks: {name: (outcome,
  message)}."""
  (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  slow: long\n")
  (tmp_path / "conftest.py").write_text(
      "from tests.support.time_budget import (pytest_addoption, pytest_configure,  # noqa\n"
      "                                       pytest_runtest_makereport)\n")
  (tmp_path / "test_budgeted.py").write_text(textwrap.dedent(_TESTS))
  (tmp_path / "known.txt").write_text(_KNOWN)
  out = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--test-budget=0.25",
       "--test-budget-tolerance=2", "--test-budget-fixed",
       f"--test-budget-known={tmp_path / 'known.txt'}", *args],
      cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300)
  outcomes = {name: word for word, name in re.findall(
      r"^(PASSED|FAILED) test_budgeted.py::(\w+)", out.stdout, re.M)}
  assert len(outcomes) == 7, out.stdout[-3000:] + out.stderr[-3000:]
  return outcomes, out.stdout


def test_a_test_over_its_allowance_fails_naming_it(tmp_path):
  """On two pytest-xdist workers, as `make test` runs: the workers' reports carry the verdict."""
  outcomes, text = _run_suite(tmp_path, "-n", "2")
  assert outcomes == {"test_quick": "PASSED", "test_new_long": "FAILED",
                      "test_listed_long": "PASSED", "test_listed_grown": "FAILED",
                      "test_marked_slow": "PASSED", "test_setup_counts": "FAILED",
                      "test_long_and_failing": "FAILED"}
  assert re.search(r"test_new_long took 1\.\d s \(setup and call\) in the default suite; the "
                   r"budget is 0\.25 s, x2 for a loaded machine = 0\.5 s\. Make it shorter", text)
  assert re.search(r"test_listed_grown took 1\.\d s .*; listed at 0\.3 s in "
                   r"tests/known_long_tests.txt, x2 for a loaded machine = 0\.6 s", text)
  assert "its own failure" in text              # a failing test keeps its own error


def test_the_budget_off_checks_nothing(tmp_path):
  outcomes, _ = _run_suite(tmp_path, "-n", "2", "--test-budget=0")
  assert [n for n, o in outcomes.items() if o == "FAILED"] == ["test_long_and_failing"]


def test_the_allowance_is_the_budget_or_the_listed_time():
  known = {"a.py::t": 90.0, "a.py::quick": 5.0}
  assert time_budget.over_budget(59.0, "b.py::t", 30, 2, known) is None
  message = time_budget.over_budget(61.0, "b.py::t", 30, 2, known)
  assert message.startswith("b.py::t took 61.0 s (setup and call) in the default suite; the "
                            "budget is 30 s, x2 for a loaded machine = 60 s.")
  assert time_budget.over_budget(179.0, "a.py::t", 30, 2, known) is None
  assert "listed at 90 s" in time_budget.over_budget(181.0, "a.py::t", 30, 2, known)
  assert time_budget.over_budget(59.0, "a.py::quick", 30, 2, known) is None   # never below


def test_a_loaded_machine_scales_the_tolerance_by_its_load_per_core():
  assert time_budget.load_factor(1.5, 2) == 1.0
  assert time_budget.load_factor(8.0, 2) == 4.0
  assert time_budget.load_factor(3.0, 0) == 3.0


def test_a_bad_allowlist_line_names_the_file_and_line(tmp_path):
  path = tmp_path / "known.txt"
  path.write_text("# comment\n\n12.5 a.py::t  # why\nabc a.py::u\n")
  with pytest.raises(ValueError, match=r"known.txt:4: expected `<seconds> <test id>`"):
    time_budget.read_known_long(str(path))
  path.write_text("12.5 a.py::t  # why\n")
  assert time_budget.read_known_long(str(path)) == {"a.py::t": 12.5}


def test_the_suites_allowlist_names_existing_tests_over_the_budget():
  """Every listed test is a test function of its file (a stale line would hide nothing, but
  would mislead), and every listed time is over the budget (a shorter test needs no line)."""
  known = time_budget.read_known_long(time_budget.KNOWN_LONG)
  for node_id, seconds in known.items():
    path, _, name = node_id.partition("::")
    with open(os.path.join(ROOT, path)) as f:
      assert f"\ndef {name.split('[')[0]}(" in f.read(), node_id
    assert seconds > 30, node_id
