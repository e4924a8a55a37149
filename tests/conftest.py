import os
import sys

# Tests run on CPU with one device unless a test starts its own subprocess with more.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# The per-test time budget of the default suite (docs/testing.md#the-time-budget).
from tests.support.time_budget import (pytest_addoption, pytest_configure,  # noqa: E402,F401
                                       pytest_runtest_makereport)
