"""HumanEval-style unit-test verification in the sandbox (DESIGN §2.4, §5).

A response is the model's continuation of `Problem.prompt` (a function signature and docstring).
The program `prompt + completion + "\\n" + tests + "\\ncheck(entry_point)\\n"` runs in
`sandbox.run_python`, in a fresh, limited interpreter, never in the training process; it scores
1.0 when it runs to the end. Runs happen on a thread pool (each thread waits on one sandbox
process), results are cached by the sha256 of the program's inputs, and `submit` lets the loop
overlap verification with other work.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import threading
from typing import Sequence

from orl_jax.verify import sandbox
from orl_jax.verify.base import Problem

# Smoke program run once before the first batch: a sandbox that cannot import the standard
# library would silently score every sample 0.
_SMOKE_PROGRAM = "import collections, functools, hashlib, itertools, math, re, string\n"


def truncate_completion(completion: str, stop_sequences: Sequence[str]) -> str:
  """Cuts the completion at the first stop sequence (e.g. the closing fence of a code block)."""
  cut = len(completion)
  for stop in stop_sequences:
    index = completion.find(stop)
    if index >= 0:
      cut = min(cut, index)
  return completion[:cut]


def humaneval_program(problem: Problem, completion: str) -> str:
  """The program that passes iff `completion` completes `problem` correctly."""
  if problem.tests is None or problem.entry_point is None:
    raise ValueError(f"Problem {problem.problem_id!r} has no tests/entry_point; HumanEvalVerifier "
                     "needs both (code tasks from data/humaneval.py or JSONL with "
                     "'tests' and 'entry_point').")
  return (problem.prompt + completion + "\n" + problem.tests
          + f"\ncheck({problem.entry_point})\n")


def cache_key(problem: Problem, completion: str) -> str:
  """sha256 over everything the program depends on (length-prefixed, so fields cannot blur)."""
  digest = hashlib.sha256()
  for field in (problem.prompt, completion, problem.tests or "", problem.entry_point or ""):
    data = field.encode("utf-8", errors="surrogatepass")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()


class HumanEvalVerifier:
  """Runs unit tests in the sandbox, `parallelism` at a time, with a result cache.

  Args:
    limits: sandbox limits per sample (timeout, memory, processes, file size).
    parallelism: concurrent sandbox processes; None → min(4, cpu count).
    stop_sequences: the completion is cut at the first of these before running (a model that
      closes its code block with a fence must not be scored on the prose after it).
    cache_size: how many results to remember (least recently used are dropped).
  """

  def __init__(self, limits: sandbox.SandboxLimits = sandbox.SandboxLimits(),
               parallelism: int | None = None, stop_sequences: Sequence[str] = ("\n```",),
               cache_size: int = 100_000):
    self.limits = limits
    self.parallelism = parallelism or min(4, os.cpu_count() or 1)
    self.stop_sequences = tuple(stop_sequences)
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[str, float] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._checked = False
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=self.parallelism, thread_name_prefix="humaneval-sandbox")
    self._gather = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="humaneval-gather")

  def run(self, problem: Problem, response: str) -> sandbox.SandboxResult:
    """Runs one sample (uncached) and returns the full sandbox record, for debugging."""
    completion = truncate_completion(response, self.stop_sequences)
    return sandbox.run_python(humaneval_program(problem, completion), self.limits)

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    return self.submit(problems, responses).result()

  def submit(self, problems: Sequence[Problem],
             responses: Sequence[str]) -> concurrent.futures.Future[list[float]]:
    """Starts verifying a batch; the future resolves to one score per response."""
    if len(problems) != len(responses):
      raise ValueError(f"score_batch got {len(problems)} problems but {len(responses)} responses.")
    self._check_sandbox()
    completions = [truncate_completion(r, self.stop_sequences) for r in responses]
    programs = [humaneval_program(p, c) for p, c in zip(problems, completions)]
    keys = [cache_key(p, c) for p, c in zip(problems, completions)]
    known: dict[str, float] = {}
    pending: dict[str, concurrent.futures.Future[bool]] = {}
    for key, program in zip(keys, programs):
      if key in known or key in pending:
        continue
      score = self._cached(key)
      if score is None:
        pending[key] = self._pool.submit(self._passes, program)
      else:
        known[key] = score
    return self._gather.submit(self._collect, keys, known, pending)

  def close(self) -> None:
    self._gather.shutdown(wait=True)
    self._pool.shutdown(wait=True)

  def __enter__(self) -> HumanEvalVerifier:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _passes(self, program: str) -> bool:
    return sandbox.run_python(program, self.limits).passed

  def _collect(self, keys: list[str], known: dict[str, float],
               pending: dict[str, concurrent.futures.Future[bool]]) -> list[float]:
    for key, future in pending.items():
      known[key] = 1.0 if future.result() else 0.0
      self._store(key, known[key])
    return [known[key] for key in keys]

  def _cached(self, key: str) -> float | None:
    with self._lock:
      score = self._cache.get(key)
      if score is not None:
        self._cache.move_to_end(key)
      return score

  def _store(self, key: str, score: float) -> None:
    with self._lock:
      self._cache[key] = score
      self._cache.move_to_end(key)
      while len(self._cache) > self.cache_size:
        self._cache.popitem(last=False)

  def _check_sandbox(self) -> None:
    """Fails loudly, once, if the sandbox cannot run a trivial stdlib program here."""
    with self._lock:
      if self._checked:
        return
      result = sandbox.run_python(_SMOKE_PROGRAM, self.limits)
      if not result.passed:
        raise RuntimeError(
            "The HumanEval sandbox cannot run a trivial program that imports the standard "
            f"library (isolation={result.isolation}, returncode={result.returncode}, "
            f"timed_out={result.timed_out}); every sample would score 0. If the launcher is "
            "root, Python must be readable by uid 65534 or the kernel must offer Landlock "
            "(Linux >= 5.13). stderr:\n"
            f"{result.stderr[-2000:]}")
      self._checked = True
