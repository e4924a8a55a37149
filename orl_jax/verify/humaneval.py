"""HumanEval-style unit-test verification in the sandbox
(docs/verifier.md#code-a-judge-that-tells-the-sample-nothing).

A response is the model's continuation of `Problem.prompt` (a function signature and docstring).
`prompt + completion` runs in the sandbox (`orl_sandbox.run_judged`), in a fresh, contained process
tree, never in the training process; it only defines the candidate function and answers calls.
The tests run in a separate judge process that executes the prompt (for helpers such as
`poly`, `encode_cyclic`, `encode_shift` that HumanEval/32, /38 and /50 call), then the tests, then
`check(candidate)`, where `candidate` sends its arguments to the sample and gets the result back
as plain data (`wire`). A sample scores 1.0 only when the judge saw `check` return; nothing the
sample does in its own process can write that verdict.

What crosses is plain data, by value (docs/verifier.md#what-crosses): numbers, strings, bytes,
None, lists, tuples, dicts, sets, frozensets, Fraction and Decimal, each decoded afresh; an
exception crosses as its class. An answer that is not plain data (a generator, a named tuple,
an instance of a class the completion defines) is judged wrong; tests whose calls the judge
cannot know in advance are "unsupported" (0, counted in `stats`). Tests outside the contract
are refused when the task loads (`test_support.refusal`, and `kept_argument_refusals` for an
argument the tests can still reach after the call).

Runs happen on `PromptScheduler` threads (each waits on one sandbox), results are cached by the
sha256 of the inputs, and `submit` lets the loop overlap verification with other work. How
samples of one prompt share the machine is the verifier's `isolation` (docs/verifier.md,
"Threat model"): "sample" (the default) runs them side by side, each in its own fresh sandbox,
as many at once as there are workers; "prompt" starts a batch's samples prompt by prompt in
turn and never runs two samples of one prompt at the same time (they could talk through the
CPU and caches they share), one prompt being tests that compute the same (`prompt_key`), and a
sample holds its slot for one of a few fixed lengths, so that when the next sample of its
prompt starts does not say when it ended. Only verdicts are cached: a run the sandbox
infrastructure failed is retried once and never cached; a timeout is cached as 0 once the same
completion timed out twice.
`stats` counts runs, timeouts, infrastructure failures, unsupported tests and the judge
processes' cost (`verify_*` metrics in training logs).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import io
import itertools
import logging
import math
import os
import threading
import time
import tokenize
from typing import Callable, Iterator, Sequence

import orl_sandbox as sandbox
from orl_sandbox import launcher as sandbox_launcher
from orl_jax.problem import Problem, truncate_completion  # noqa: F401  (re-exported)
from orl_jax.verify import test_support

_log = logging.getLogger(__name__)

# Smoke program run once before the first batch: a sandbox that cannot import the standard
# library would silently score every sample 0.
_SMOKE_PROGRAM = ("import collections, functools, hashlib, itertools, math, re, string\n"
                  "def f(x):\n  return (x, math.sqrt(x))\n")
_SMOKE_TESTS = "def check(candidate):\n  assert candidate(4) == (4, 2.0)\n"
# Time after a sample's timeout within which its kill and teardown end (a timed-out run holds its
# scheduling slot for the timeout plus this).
_TEARDOWN_S = 2.0


def _require_tests(problem: Problem) -> tuple[str, str]:
  """The problem's (entry_point, tests); both are needed."""
  if problem.tests is None or problem.entry_point is None:
    raise ValueError(f"Problem {problem.problem_id!r} has no tests/entry_point; HumanEvalVerifier "
                     "needs both (code tasks from data/humaneval.py or JSONL with "
                     "'tests' and 'entry_point').")
  return problem.entry_point, problem.tests


@functools.lru_cache(maxsize=4096)
def _refusal(tests: str, entry_point: str, prompt: str) -> test_support.Refusal | None:
  return test_support.refusal(tests, entry_point, prompt)


def judge_run(problem: Problem, completion: str,
              limits: sandbox.SandboxLimits) -> sandbox.SandboxResult:
  """Scores one completion: the candidate in the sandbox, the tests in the judge process.
  Tests outside the judge's contract (the task loader refuses them; a problem built by hand
  is not loaded) are not judged: "unsupported", with the loader's sentence, nothing run."""
  entry_point, tests = _require_tests(problem)
  found = _refusal(tests, entry_point, problem.prompt)
  if found is not None:
    return sandbox.SandboxResult(passed=False, timed_out=False, returncode=None, stdout="",
                                 stderr="", isolation=(), wall_s=0.0, verdict="unsupported",
                                 detail=f"not judged: {found.sentence()}")
  return sandbox.run_judged(problem.prompt + completion + "\n", entry_point,
                            tests=tests, prelude=problem.prompt, limits=limits)


# A sample's wall timeout over its CPU limit where the limit comes from the problem's reference
# (`limits_for`): the head room the configured limits keep (the 10 s timeout over the 3 s of
# `task.verify_cpu_s`), for the sandbox's start-up (up to 3.2 s measured for the first runs of a
# cold fork server on 2 cores), the judge's work and a sample waiting for a core, so that a loop
# ends at its CPU limit.
WALL_MARGIN_S = 7.0


def limits_for(problem: Problem, limits: sandbox.SandboxLimits) -> sandbox.SandboxLimits:
  """The limits `problem`'s samples run under: `limits` (the task's configured ones) unless the
  problem has a measured time limit (`Problem.time_limit_s`, verify/time_limits.py); then that
  as the CPU limit (whole seconds, `RLIMIT_CPU`), the wall timeout `WALL_MARGIN_S` above it, and
  the judge's CPU limit of `limits` (the judge's cost stays what the task configured)."""
  if problem.time_limit_s is None:
    return limits
  cpu_s = max(1, math.ceil(problem.time_limit_s))
  return dataclasses.replace(limits, cpu_s=cpu_s, timeout_s=cpu_s + WALL_MARGIN_S,
                             judge_cpu_s=sandbox_launcher.judge_cpu_s(limits))


def _string_spans(text: str) -> Iterator[tuple[int, int]]:
  """(start, end) offsets of the string literals of `text`, in order, as far as it tokenizes; a
  multi-line string left open runs to the end of `text`."""
  line_starts = [0, *itertools.accumulate(len(line) + 1 for line in text.split("\n"))]
  kinds = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
  last_end = 0
  try:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
      start = line_starts[token.start[0] - 1] + token.start[1]
      last_end = line_starts[token.end[0] - 1] + token.end[1]
      if token.type in kinds:
        yield start, last_end
  except (tokenize.TokenError, SyntaxError) as error:
    if _open_string(error):
      yield last_end, len(text)


@functools.lru_cache(maxsize=1024)
def _ends_in_a_string(prompt: str) -> bool:
  """Whether `prompt` ends inside a multi-line string literal."""
  try:
    for _ in tokenize.generate_tokens(io.StringIO(prompt).readline):
      pass
  except (tokenize.TokenError, SyntaxError) as error:
    return _open_string(error)
  return False


def _open_string(error: Exception) -> bool:
  """Whether a tokenizer error says a multi-line string is left open."""
  return "multi-line string" in str(error) or "triple-quoted" in str(error)


def cut_completion(prompt: str, response: str, stop_sequences: Sequence[str]) -> str:
  """`response` cut at the first of `stop_sequences` that is not inside a string literal of
  `prompt + response` (a fence the completion writes in a docstring or a triple-quoted string
  is code, a closing fence after the code ends it). Where the code stops tokenizing before a
  stop sequence, the cut is at that stop sequence."""
  found = sorted({i for stop in stop_sequences if stop for i in _occurrences(response, stop)})
  if not found:
    return response
  before = response[:found[0] + 1]
  if not any(opener in before for opener in ('"""', "'''", "\\\n")) and (
      not _ends_in_a_string(prompt)):
    return response[:found[0]]   # no string can be open there (the common case)
  spans = _string_spans(prompt + response)
  span = next(spans, None)
  for index in found:
    at = len(prompt) + index
    while span is not None and span[1] <= at:
      span = next(spans, None)
    if span is None or not span[0] < at:
      return response[:index]
  return response


def _occurrences(text: str, stop: str) -> Iterator[int]:
  index = text.find(stop)
  while index >= 0:
    yield index
    index = text.find(stop, index + 1)


def fields_digest(fields: Sequence[str]) -> str:
  """sha256 over `fields`, each length-prefixed so that fields cannot blur into each other."""
  digest = hashlib.sha256()
  for field in fields:
    data = field.encode("utf-8", errors="surrogatepass")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()


def cache_key(problem: Problem, completion: str) -> str:
  """The digest of everything the program and its limits depend on."""
  return fields_digest((problem.prompt, completion, problem.tests or "",
                        problem.entry_point or "", repr(problem.time_limit_s)))


@dataclasses.dataclass
class VerifierStats:
  """What a verifier's sandboxed runs did, in all (logged as `verify_*` metrics).

  Attributes:
    runs: sandboxed runs that returned a record (retries included).
    timeouts: runs ended by the wall-clock timeout.
    timeouts_cached: completions cached as 0 after their second timeout.
    infra_errors: runs the sandbox infrastructure failed (retried, never cached).
    unsupported: runs whose tests the judge could not replay (scored 0, listed in
      `HumanEvalVerifier.unsupported`).
    judge_cpu_s: CPU seconds of the judge processes, summed.
    judge_peak_rss_bytes: the largest peak resident memory of one judge process.
  """
  runs: int = 0
  timeouts: int = 0
  timeouts_cached: int = 0
  infra_errors: int = 0
  unsupported: int = 0
  judge_cpu_s: float = 0.0
  judge_peak_rss_bytes: int = 0

  def add(self, result: sandbox.SandboxResult) -> None:
    self.runs += 1
    self.timeouts += int(result.timed_out)
    self.unsupported += int(result.verdict == "unsupported")
    self.judge_cpu_s += result.judge_cpu_s or 0.0
    self.peak(result.judge_peak_rss_bytes or 0)

  def peak(self, rss: int) -> None:
    self.judge_peak_rss_bytes = max(self.judge_peak_rss_bytes, rss)

  def metrics(self) -> dict[str, float]:
    return {f"verify_{f.name}": float(getattr(self, f.name)) for f in dataclasses.fields(self)}


# What a sandboxed program of the judge's starts with: the judge's own modules, loaded from their
# text (the sandbox hides the installed packages).
_JUDGE_PRELUDE = """\
import json, sys, types
def _load(name, source):
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module
_load("_orl_sandbox_script_wire", {wire!r})
judge = _load("_orl_sandbox_script_judge", {judge!r})
"""
# The program that computes a task's prompt key in the sandbox (`judge.call_set_digest`).
_KEY_PROGRAM = _JUDGE_PRELUDE + """\
task = json.loads({task!r})
print("prompt key", judge.call_set_digest(task["prompt"], task["tests"], task["entry_point"]))
"""


def prompt_key(problem: Problem, limits: sandbox.SandboxLimits = sandbox.SandboxLimits()) -> str:
  """What makes two samples "of one prompt" (the "prompt" isolation's exclusive slots and
  interleaving): what the tests ask the candidate, not how they are written. The key is the
  sha256 of the distinct calls the tests make (`judge.call_set_digest`: each call's arguments
  as the judge sends them, sorted), collected by the judge's own recorder inside the sandbox
  (the tests and the prompt are task code), so copies of a task that differ in wording, names,
  messages, metadata, the order of their asserts or repeated calls share a key, and their
  samples never run at once. Expected values are left out: two ways to write one expected value
  (`0.5`, `1 / 2`, a tolerance) must not part two copies. Computed once per task (cached); where
  the sandbox run fails the key is the tests' text (and a warning says so)."""
  return _calls_key(problem.prompt, problem.tests or "", problem.entry_point or "", limits)


@functools.lru_cache(maxsize=4096)
def _calls_key(prompt: str, tests: str, entry_point: str, limits: sandbox.SandboxLimits) -> str:
  import json  # pylint: disable=import-outside-toplevel
  sources = _judge_sources()
  task = json.dumps({"prompt": prompt, "tests": tests, "entry_point": entry_point})
  result = sandbox.run_python(_KEY_PROGRAM.format(task=task, **sources), limits)
  found = [line.split()[-1] for line in result.stdout.splitlines()
           if line.startswith("prompt key ")]
  if result.passed and len(found) == 1:
    return found[0]
  _log.warning("The prompt key of a task could not be computed in the sandbox (%s); its key is "
               "its tests' text.", result.infra_error or result.stderr[-300:] or result.returncode)
  return "text:" + hashlib.sha256(tests.encode("utf-8", errors="surrogatepass")).hexdigest()


# The program that runs the judge's collection step over many tasks in one sandbox run and
# prints the kept-argument refusals (`judge.collect`).
_KEPT_PROGRAM = _JUDGE_PRELUDE + """\
for index, task in enumerate(json.loads({tasks!r})):
    refusal = judge.collect(task["prompt"], task["tests"], task["entry_point"])[1]
    print("kept", json.dumps([index, refusal]), flush=True)
"""
_KEPT: dict[str, str] = {}   # fields_digest of a task -> its refusal ("" when none)
_KEPT_LOCK = threading.Lock()


def kept_argument_refusals(problems: Sequence[Problem],
                           limits: sandbox.SandboxLimits | None = None) -> list[str]:
  """For each code problem, the sentence refusing its tests when they pass the candidate a
  mutable argument they can still reach after the call (they would see what the candidate does
  to it, which the plain-data judge never sends back), else "". The judge's own collection step
  decides (`judge.collect`), run over every task not seen before in one sandbox run (the tests
  are task code); answers are cached per task. Where the sandbox run fails, a warning says so
  and the tasks load: the judge still refuses such a task at every sample ("unsupported")."""
  import json  # pylint: disable=import-outside-toplevel
  keys = [fields_digest((p.prompt, p.tests or "", p.entry_point or "")) for p in problems]
  with _KEPT_LOCK:
    todo = {k: p for k, p in zip(keys, problems) if k not in _KEPT and p.tests is not None
            and p.entry_point is not None}
  if todo:
    tasks = json.dumps([{"prompt": p.prompt, "tests": p.tests, "entry_point": p.entry_point}
                        for p in todo.values()])
    limits = limits or sandbox.SandboxLimits(timeout_s=30.0 + 0.2 * len(todo),
                                             max_output_bytes=1 << 22)
    result = sandbox.run_python(_KEPT_PROGRAM.format(tasks=tasks, **_judge_sources()), limits)
    found = dict(json.loads(line[5:]) for line in result.stdout.splitlines()
                 if line.startswith("kept "))
    if not result.passed or len(found) != len(todo):
      _log.warning("The kept-argument check of %d task(s) could not run in the sandbox (%s); "
                   "they load, and the judge refuses such tests at each sample.", len(todo),
                   result.infra_error or result.stderr[-300:] or result.returncode)
    with _KEPT_LOCK:
      _KEPT.update((key, found[i]) for i, key in enumerate(todo) if i in found)
  with _KEPT_LOCK:
    return [_KEPT.get(k, "") for k in keys]


def _judge_sources() -> dict[str, str]:
  import pathlib  # pylint: disable=import-outside-toplevel
  from orl_sandbox import judge as judge_module, wire   # pylint: disable=import-outside-toplevel
  return {name: pathlib.Path(str(module.__file__)).read_text(encoding="utf-8")
          for name, module in (("wire", wire), ("judge", judge_module))}


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


@dataclasses.dataclass
class _Job:
  prompt: str
  run: Callable[[], object]
  future: concurrent.futures.Future
  lock: int | None = None


def slot_length(elapsed: float, slot_s: float, longest_s: float = float("inf")) -> float:
  """How long a run of `elapsed` seconds holds its slot: the first of `slot_s`, `2 * slot_s`,
  `4 * slot_s`, ... that it fits in, or `longest_s` (a timed-out run's length) when that is
  shorter, then its multiples by powers of two. When the next sample starts then says at most
  which of a few lengths the run fell in, not when it ended."""
  if slot_s <= 0:
    return elapsed
  held = slot_s
  while held < elapsed and held < longest_s:
    held *= 2
  if held >= longest_s:
    held = longest_s
    while held < elapsed:
      held *= 2
  return held


# `HumanEvalVerifier(isolation=...)`, `task.verify_isolation` (orl_jax/config/sections.py
# VerifyIsolation): "sample" runs a prompt's samples side by side, "prompt" one at a time in slots.
ISOLATIONS = ("sample", "prompt")


class PromptScheduler:
  """Runs jobs `parallelism` at a time. With `exclusive` (the "prompt" isolation), never two of
  one prompt at once: not in this process (all schedulers share the set of running prompts)
  and not on this machine (`orl_sandbox.claim_exclusive`), since samples of one prompt could
  otherwise talk through the CPU and caches they share; samples of different prompts answer
  different questions. Jobs start in the order given, skipping those whose prompt is busy.
  Without `exclusive` (the "sample" isolation) jobs start in the order given as workers free
  up, and a worker is free again when its run ends (`slot_s` must be 0).

  A job holds its worker and its prompt for a slot (`slot_length`), not until it ends: a slot
  ends at a time fixed by when it started and which power-of-two multiple of `slot_s` its run
  fell in, and every start is a submission or the end of some slot, so a sample that ends
  early cannot move the start of the next sample of its prompt (nor free a worker for another
  prompt sooner, which would move it too). `slot_s` 0 releases both at the end of the run."""

  _running: set[str] = set()
  _changed = threading.Condition()

  def __init__(self, parallelism: int, name: str = "humaneval-sandbox", slot_s: float = 0.25,
               longest_s: float = float("inf"), exclusive: bool = True):
    if slot_s and not exclusive:
      raise ValueError(f"slot_s={slot_s} hides when a sample of a prompt ended from the next "
                       "one, which only exclusive scheduling has; pass slot_s=0")
    self.slot_s, self.longest_s, self.exclusive = slot_s, longest_s, exclusive
    self._queue: list[_Job] = []
    self._closed = False
    self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                     for i in range(parallelism)]
    for thread in self._threads:
      thread.start()

  def submit(self, prompt: str, run) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    with self._changed:
      if self._closed:
        raise RuntimeError("the verifier is closed")
      self._queue.append(_Job(prompt, run, future))
      self._changed.notify_all()
    return future

  def close(self) -> None:
    with self._changed:
      self._closed = True
      self._changed.notify_all()
    for thread in self._threads:
      thread.join()

  def _take(self) -> _Job | None:
    """The first queued job whose prompt nobody runs (called holding `_changed`)."""
    while True:
      if self._queue and not self.exclusive:
        return self._queue.pop(0)
      for index, job in enumerate(self._queue):
        if job.prompt in self._running:
          continue
        job.lock = sandbox.claim_exclusive(job.prompt)
        if job.lock is not None:
          self._running.add(job.prompt)
          return self._queue.pop(index)
      if self._closed and not self._queue:
        return None
      # Prompts held by other processes are released without a notification: poll.
      self._changed.wait(timeout=0.05 if self._queue else None)

  def _work(self) -> None:
    while True:
      with self._changed:
        job = self._take()
      if job is None:
        return
      start = time.monotonic()
      try:
        if job.future.set_running_or_notify_cancel():
          job.future.set_result(job.run())
      except BaseException as error:  # pylint: disable=broad-except
        job.future.set_exception(error)
      finally:
        elapsed = time.monotonic() - start
        time.sleep(max(0.0, start + slot_length(elapsed, self.slot_s, self.longest_s)
                            - time.monotonic()))
        if self.exclusive:
          sandbox.release_exclusive(job.lock)
          with self._changed:
            self._running.discard(job.prompt)
            self._changed.notify_all()


def host_workers() -> int:
  """The cores this process may run on (its CPU affinity; the machine's count where affinity
  is unknown): the verifier's default parallelism."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except (AttributeError, OSError):
    return max(1, os.cpu_count() or 1)


class HumanEvalVerifier:
  """Runs unit tests in the sandbox, `parallelism` at a time, with a result cache.

  Args:
    limits: sandbox limits per sample (timeout, memory, processes, file size); a problem with a
      measured time limit runs with its own CPU and wall limits (`limits_for`).
    parallelism: concurrent sandbox processes; None → the host's usable cores
      (`host_workers`). With `isolation="prompt"` samples of one prompt never run at the same
      time (`PromptScheduler`), so one batch of P prompts keeps at most P of them busy.
    stop_sequences: the completion is cut at the first of these outside a string literal
      before running (a model that closes its code block with a fence must not be scored on
      the prose after it; a fence inside a string is part of the code: `cut_completion`).
    cache_size: how many results to remember (least recently used are dropped).
    isolation: "sample" (default): a prompt's samples run side by side, each in a fresh
      sandbox, in the order given; "prompt": never two samples of one prompt at once, a
      batch's prompts in turn, each sample holding a slot (docs/verifier.md#threat-model says
      what each closes).
    slot_s: with `isolation="prompt"`, the shortest time a sample holds its worker and prompt
      (`PromptScheduler`; default 0.25 s), so that when a prompt's next sample starts carries
      nothing about when this one ended; set it above an honest sample's run time (longer runs
      hold a power-of-two multiple of it). "sample" isolation has no slots (None or 0).
  """

  def __init__(self, limits: sandbox.SandboxLimits = sandbox.SandboxLimits(),
               parallelism: int | None = None, stop_sequences: Sequence[str] = ("\n```",),
               cache_size: int = 100_000, isolation: str = "sample",
               slot_s: float | None = None):
    if isolation not in ISOLATIONS:
      raise ValueError(f"isolation={isolation!r} must be one of {ISOLATIONS}")
    if isolation == "sample" and slot_s:
      raise ValueError(f"slot_s={slot_s} applies to isolation='prompt' only (a sample's slot "
                       "hides its exit time from the next sample of its prompt)")
    self.isolation = isolation
    self.limits = limits
    self.parallelism = parallelism or host_workers()
    self.stop_sequences = tuple(stop_sequences)
    self.cache_size = cache_size
    self._cache: collections.OrderedDict[str, float] = collections.OrderedDict()
    self._timeouts: collections.OrderedDict[str, int] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._checked = False
    self.stats = VerifierStats()
    self.unsupported: dict[str, str] = {}   # problem id -> why its tests could not be judged
    # A timed-out run (the timeout, then the kill and the judge) holds its slot this long.
    exclusive = isolation == "prompt"
    self._scheduler = PromptScheduler(
        self.parallelism, slot_s=(0.25 if slot_s is None else slot_s) if exclusive else 0.0,
        longest_s=limits.timeout_s + _TEARDOWN_S, exclusive=exclusive)
    self._gather = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="humaneval-gather")

  def run(self, problem: Problem, response: str) -> sandbox.SandboxResult:
    """Runs one sample (uncached) and returns the full sandbox record, for debugging."""
    completion = cut_completion(problem.prompt, response, self.stop_sequences)
    return judge_run(problem, completion, limits_for(problem, self.limits))

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
    completions = [cut_completion(p.prompt, r, self.stop_sequences)
                   for p, r in zip(problems, responses)]
    keys = [cache_key(p, c) for p, c in zip(problems, completions)]
    prompts = self._prompt_keys(problems)
    known: dict[str, float] = {}
    pending: dict[str, concurrent.futures.Future[tuple[float, bool]]] = {}
    order = interleaved(prompts) if self.isolation == "prompt" else range(len(keys))
    for i in order:
      key = keys[i]
      if key in known or key in pending:
        continue
      score = self._cached(key)
      if score is None:
        pending[key] = self._scheduler.submit(
            prompts[i], functools.partial(self._score, problems[i], completions[i], key))
      else:
        known[key] = score
    return self._gather.submit(self._collect, keys, known, pending)

  def _prompt_keys(self, problems: Sequence[Problem]) -> list[str]:
    """`prompt_key` of each problem under "prompt" isolation (new tasks' keys computed side by
    side); under "sample" isolation no two samples share anything, so the problem id stands."""
    if self.isolation != "prompt":
      return [p.problem_id for p in problems]
    distinct = list({(p.prompt, p.tests, p.entry_point): p for p in problems}.values())
    with concurrent.futures.ThreadPoolExecutor(self.parallelism) as pool:
      keys = dict(zip([(p.prompt, p.tests, p.entry_point) for p in distinct], pool.map(
          functools.partial(prompt_key, limits=self.limits), distinct)))
    return [keys[(p.prompt, p.tests, p.entry_point)] for p in problems]

  def close(self) -> None:
    self._gather.shutdown(wait=True)
    self._scheduler.close()

  def __enter__(self) -> HumanEvalVerifier:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _score(self, problem: Problem, completion: str, key: str) -> tuple[float, bool]:
    """(score, cacheable). A run the infrastructure failed is retried once, then scores 0
    uncached; a timeout scores 0, cached once the same completion timed out twice (a policy
    that learns to sleep must not cost a slot for the whole timeout on every submission)."""
    for attempt in range(2):
      try:
        result = judge_run(problem, completion, limits_for(problem, self.limits))
      except OSError as error:   # e.g. no memory or pids left to start the sandbox
        infra = repr(error)
      else:
        if result.infra_error is None:
          return self._account(problem, result, key)
        infra = result.infra_error
      with self._lock:
        self.stats.infra_errors += 1
      if attempt == 0:
        time.sleep(0.5)
    _log.warning("HumanEval sandbox infrastructure failure (score 0, not cached): %s", infra)
    return 0.0, False

  def _account(self, problem: Problem, result: sandbox.SandboxResult,
               key: str) -> tuple[float, bool]:
    with self._lock:
      self.stats.add(result)
      if result.verdict == "unsupported" and problem.problem_id not in self.unsupported:
        self.unsupported[problem.problem_id] = result.detail
        _log.warning("HumanEval judge cannot replay the tests of %s (its samples score 0): %s",
                     problem.problem_id, result.detail)
      if not result.timed_out:
        return (1.0 if result.passed else 0.0), True
      count = self._timeouts.pop(key, 0) + 1
      self._timeouts[key] = count
      while len(self._timeouts) > self.cache_size:
        self._timeouts.popitem(last=False)
      self.stats.timeouts_cached += int(count >= 2)
      return 0.0, count >= 2

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
