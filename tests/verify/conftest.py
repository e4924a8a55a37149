"""Fixtures shared by the sandbox's tests."""
import os
import pathlib
import tempfile
import time

import pytest

from orl_sandbox import launcher as sandbox


@pytest.fixture
def private_tmp(monkeypatch, tmp_path_factory):
  """A temporary root of this test's own (mode 0755, so a sandbox's unprivileged user can
  traverse it): the sandbox directories a test counts are then its own, whatever else on the
  machine (another test worker, another run) creates sandboxes in the shared temp directory."""
  tmp_path_factory.getbasetemp()   # pytest's own temp root is fixed before TMPDIR moves
  root = tempfile.mkdtemp(prefix="orl_test_tmp_")
  os.chmod(root, 0o755)
  monkeypatch.setenv("TMPDIR", root)
  monkeypatch.setattr(tempfile, "tempdir", root)
  yield pathlib.Path(root)
  monkeypatch.undo()
  sandbox.remove_tree(root)


@pytest.fixture
def judged_spans(monkeypatch):
  """(problem id, start, end) of every sandboxed run the HumanEval verifier makes while the test
  runs (`humaneval.judge_run` wrapped), in the order the runs end."""
  from orl_jax.verify import humaneval
  spans, real = [], humaneval.judge_run

  def recorded(problem, completion, limits):
    start = time.monotonic()
    result = real(problem, completion, limits)
    spans.append((problem.problem_id, start, time.monotonic()))
    return result

  monkeypatch.setattr(humaneval, "judge_run", recorded)
  return spans
