"""The per-test time budget of the default suite (docs/testing.md#the-time-budget).

A test that is not marked `slow` fails when its setup and call together take longer than the
budget times a tolerance for a loaded machine (`--test-budget=30`, `--test-budget-tolerance=2`:
60 s, times the load average per core when it is over 1), unless `tests/known_long_tests.txt`
lists it; a listed test fails above its recorded seconds times the same tolerance. So the
suite's known long tests stay as measured and a new long test fails where it is added: mark it
`slow` (a fast test keeping its guard in the default run), make it shorter, or, where it must be
long, list it with its measured time.

The setup counted is the test's own: with module fixtures, the first test of a file pays for
them (CI runs whole files). `--test-budget=0` turns the check off (a debugger, a profiler).
"""
from __future__ import annotations

import os

import pytest

KNOWN_LONG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "known_long_tests.txt")
SETUP_SECONDS = pytest.StashKey[float]()      # a test's setup, until its call is reported
KNOWN = pytest.StashKey[dict]()               # the allowlist, read once per session


def read_known_long(path: str) -> dict[str, float]:
  """{test node id: measured seconds} of the allowlist: `<seconds> <node id>` per line, `#`
  comments and blank lines ignored."""
  known = {}
  with open(path) as f:
    for number, line in enumerate(f, 1):
      line = line.split("#", 1)[0].strip()
      if not line:
        continue
      seconds, _, node_id = line.partition(" ")
      try:
        known[node_id.strip()] = float(seconds)
      except ValueError:
        raise ValueError(f"{path}:{number}: expected `<seconds> <test id>`, got {line!r}"
                         ) from None
  return known


def allowance(node_id: str, budget: float, known: dict[str, float]) -> float:
  """The seconds a test may take before the tolerance: its measured time when listed (never
  below the budget), the budget otherwise."""
  return max(budget, known.get(node_id, 0.0))


def load_factor(load: float, cpus: int) -> float:
  """How many times slower a test may run on a machine busy with `load` runnable processes (the
  1-minute load average) over `cpus` cores: 1 up to one per core, then load / cpus."""
  return max(1.0, load / max(cpus, 1))


def over_budget(seconds: float, node_id: str, budget: float, tolerance: float,
                known: dict[str, float]) -> str | None:
  """The failure message when `seconds` exceeds the test's allowance times `tolerance`, else
  None."""
  limit = allowance(node_id, budget, known) * tolerance
  if seconds <= limit:
    return None
  listed = (f"listed at {known[node_id]:g} s in tests/known_long_tests.txt" if node_id in known
            else f"the budget is {budget:g} s")
  return (f"{node_id} took {seconds:.1f} s (setup and call) in the default suite; {listed}, "
          f"x{tolerance:.3g} for a loaded machine = {limit:.3g} s. Make it shorter, mark it "
          "`@pytest.mark.slow` (keeping a fast test of what it guards), or list its measured "
          "time in tests/known_long_tests.txt (docs/testing.md#the-time-budget).")


def pytest_addoption(parser):
  group = parser.getgroup("time budget")
  group.addoption("--test-budget", type=float, default=30.0, metavar="SECONDS",
                  help="a test not marked slow fails above this (times the tolerance) unless "
                       "tests/known_long_tests.txt lists it; 0: no check")
  group.addoption("--test-budget-tolerance", type=float, default=2.0, metavar="FACTOR",
                  help="factor on every allowance for a loaded machine")
  group.addoption("--test-budget-fixed", action="store_true",
                  help="do not scale the tolerance by the machine's load average per core")
  group.addoption("--test-budget-known", default=KNOWN_LONG, metavar="PATH",
                  help="the allowlist of known long tests")


def pytest_configure(config):
  budget = config.getoption("--test-budget", None)
  config.stash[KNOWN] = (read_known_long(config.getoption("--test-budget-known"))
                         if budget else {})



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Turns a passed call of a test over its allowance into a failure with one sentence."""
  outcome = yield
  report = outcome.get_result()
  budget = item.config.getoption("--test-budget", None)
  if not budget or item.get_closest_marker("slow") is not None:
    return
  if report.when == "setup":
    item.stash[SETUP_SECONDS] = report.duration
  elif report.when == "call" and report.passed:
    seconds = item.stash.get(SETUP_SECONDS, 0.0) + report.duration
    tolerance = item.config.getoption("--test-budget-tolerance")
    if not item.config.getoption("--test-budget-fixed"):
      tolerance *= load_factor(os.getloadavg()[0], os.cpu_count() or 1)
    message = over_budget(seconds, item.nodeid, budget, tolerance, item.config.stash[KNOWN])
    if message:
      report.outcome = "failed"
      report.longrepr = message
