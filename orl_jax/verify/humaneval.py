"""HumanEval-style unit-test verification in the sandbox (DESIGN §2.4, §5).

A response is the model's continuation of `Problem.prompt` (a function signature and docstring).
`prompt + completion` runs in the sandbox (`orl_sandbox.run_judged`), in a fresh, contained process
tree, never in the training process; it only defines the candidate function and answers calls.
The tests run in a separate judge process that executes the prompt (for helpers such as
`poly`, `encode_cyclic`, `encode_shift` that HumanEval/32, /38 and /50 call), then the tests, then
`check(candidate)`, where `candidate` sends its arguments to the sample and gets the result back
as plain data (`wire`). A sample scores 1.0 only when the judge saw `check` return; nothing the
sample does in its own process can write that verdict.

Consequence for completions: results must be plain data (None, bool, int, float, complex, str,
bytes, and lists, tuples, sets, frozensets, dicts of them), as every HumanEval canonical
solution's are; anything else (a generator, a NumPy scalar, a subclass of a built-in) scores 0.
Arguments are copies: a candidate mutating its argument is not seen by the tests (no HumanEval
test looks; /70, /120 and /149's canonical solutions mutate theirs).

Runs happen on a thread pool (each thread waits on one sandbox), results are cached by the
sha256 of the inputs, and `submit` lets the loop overlap verification with other work. The pool
takes a batch's samples prompt by prompt in turn (the first sample of every prompt, then the
second, ...), so that samples of one prompt, which could copy from each other, rarely run side
by side. Only verdicts are cached: a run the sandbox infrastructure failed is retried once, and
neither it nor a timeout (which may come from a loaded machine) is ever cached. `judge_cost`
adds up what the judge processes used.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import threading
import time
from typing import Sequence

import orl_sandbox as sandbox
from orl_jax.problem import Problem, truncate_completion

_log = logging.getLogger(__name__)

# Smoke program run once before the first batch: a sandbox that cannot import the standard
# library would silently score every sample 0.
_SMOKE_PROGRAM = ("import collections, functools, hashlib, itertools, math, re, string\n"
                  "def f(x):\n  return (x, math.sqrt(x))\n")
_SMOKE_TESTS = "def check(candidate):\n  assert candidate(4) == (4, 2.0)\n"


def _require_tests(problem: Problem) -> None:
  if problem.tests is None or problem.entry_point is None:
    raise ValueError(f"Problem {problem.problem_id!r} has no tests/entry_point; HumanEvalVerifier "
                     "needs both (code tasks from data/humaneval.py or JSONL with "
                     "'tests' and 'entry_point').")


def judge_run(problem: Problem, completion: str,
              limits: sandbox.SandboxLimits) -> sandbox.SandboxResult:
  """Scores one completion: the candidate in the sandbox, the tests in the judge process."""
  _require_tests(problem)
  return sandbox.run_judged(problem.prompt + completion + "\n", problem.entry_point,
                            tests=problem.tests, prelude=problem.prompt, limits=limits)


def cache_key(problem: Problem, completion: str) -> str:
  """sha256 over everything the program depends on (length-prefixed, so fields cannot blur)."""
  digest = hashlib.sha256()
  for field in (problem.prompt, completion, problem.tests or "", problem.entry_point or ""):
    data = field.encode("utf-8", errors="surrogatepass")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()


@dataclasses.dataclass
class JudgeCost:
  """What the judge processes of a verifier's runs used, in all."""
  runs: int = 0
  cpu_s: float = 0.0
  peak_rss_bytes: int = 0

  def add(self, result: sandbox.SandboxResult) -> None:
    self.runs += 1
    self.cpu_s += result.judge_cpu_s or 0.0
    self.peak_rss_bytes = max(self.peak_rss_bytes, result.judge_peak_rss_bytes or 0)


def interleaved(keys: Sequence[str]) -> list[int]:
  """Indices of `keys` taken one per distinct key in turn: [a, a, b, b] -> a, b, a, b."""
  by_key: dict[str, list[int]] = {}
  for index, key in enumerate(keys):
    by_key.setdefault(key, []).append(index)
  queues = list(by_key.values())
  order = []
  for depth in range(max((len(q) for q in queues), default=0)):
    order += [q[depth] for q in queues if depth < len(q)]
  return order


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
    self.judge_cost = JudgeCost()
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=self.parallelism, thread_name_prefix="humaneval-sandbox")
    self._gather = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="humaneval-gather")

  def run(self, problem: Problem, response: str) -> sandbox.SandboxResult:
    """Runs one sample (uncached) and returns the full sandbox record, for debugging."""
    completion = truncate_completion(response, self.stop_sequences)
    return judge_run(problem, completion, self.limits)

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    return self.submit(problems, responses).result()

  def submit(self, problems: Sequence[Problem],
             responses: Sequence[str]) -> concurrent.futures.Future[list[float]]:
    """Starts verifying a batch; the future resolves to one score per response."""
    if len(problems) != len(responses):
      raise ValueError(f"score_batch got {len(problems)} problems but {len(responses)} responses.")
    for problem in problems:
      _require_tests(problem)
    self._check_sandbox()
    completions = [truncate_completion(r, self.stop_sequences) for r in responses]
    keys = [cache_key(p, c) for p, c in zip(problems, completions)]
    known: dict[str, float] = {}
    pending: dict[str, concurrent.futures.Future[tuple[float, bool]]] = {}
    for i in interleaved([p.problem_id for p in problems]):
      key = keys[i]
      if key in known or key in pending:
        continue
      score = self._cached(key)
      if score is None:
        pending[key] = self._pool.submit(self._score, problems[i], completions[i])
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

  def _score(self, problem: Problem, completion: str) -> tuple[float, bool]:
    """(score, cacheable). A run the infrastructure failed is retried once, then scores 0
    uncached; a timeout scores 0 uncached (it may come from load, not from the sample)."""
    for attempt in range(2):
      try:
        result = judge_run(problem, completion, self.limits)
      except OSError as error:   # e.g. no memory or pids left to start the sandbox
        result = None
        infra = repr(error)
      else:
        infra = result.infra_error
        with self._lock:
          self.judge_cost.add(result)
      if infra is None:
        return (1.0 if result.passed else 0.0), not result.timed_out
      if attempt == 0:
        time.sleep(0.5)
    _log.warning("HumanEval sandbox infrastructure failure (score 0, not cached): %s", infra)
    return 0.0, False

  def _collect(self, keys: list[str], known: dict[str, float],
               pending: dict[str, concurrent.futures.Future[tuple[float, bool]]]) -> list[float]:
    for key, future in pending.items():
      known[key], cacheable = future.result()
      if cacheable:
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
      # Raises SandboxUnavailableError when an essential isolation layer is missing.
      result = sandbox.run_judged(_SMOKE_PROGRAM, "f", _SMOKE_TESTS, limits=self.limits)
      if not result.passed:
        raise RuntimeError(
            "The HumanEval sandbox cannot run a trivial function that imports the standard "
            f"library (isolation={result.isolation}, verdict={result.verdict!r}, "
            f"detail={result.detail!r}, infra_error={result.infra_error!r}, "
            f"timed_out={result.timed_out}); every sample would score 0. stderr:\n"
            f"{result.stderr[-2000:]}")
      self._checked = True
