"""The judge's side of `run_judged`: tests that reveal nothing about correctness to the sample.

A sample that learns, while it runs, whether its answers were right can tell other samples (a
probe that the rest copy). With the usual harness it learns it from the calls themselves: the
tests stop at the first failed assert, so a next call arrives only after a right answer. Here
the calls the sample sees are fixed before it answers any, and the verdict is computed only
after its processes are dead, in three steps:

1. `collect_calls` (before any answer): the tests run against a recorder. Every call returns
   `_Opaque`, a stand-in that is true, equal to anything and absorbs every operation, so the
   tests follow the path a passing candidate takes; the tests are rewritten so that an assert
   never fails and a statement that raises does not stop the ones after it
   (`_keep_going`). The result is the list of calls, in order.
2. `exchange`: the sample answers exactly that list, one call at a time; the judge stores the raw
   replies (capped in size) without looking at them. The sample is then killed.
3. `replay_verdict` (the sample dead): the prompt and the *unmodified* tests run again with a
   proxy that hands out the stored replies in order. The verdict is the original tests'
   semantics: answers are real instances of their types, exceptions are raised as their classes
   (matched through the class hierarchy, never by name), and what the candidate did to its
   arguments is done to the tests' own objects when its answer arrives (`wire.Session` on both
   sides; an argument passed again is the sample's same object), as is what it did meanwhile to
   any container that crossed earlier. A value the judge cannot reproduce exactly (a
   set's order, a stateful default factory: `wire.Unsupported`) leaves the sample not judged,
   as below. A call that step 1 could not
   know in advance (its arguments depend on an earlier answer, `candidate(candidate(x))`, or on
   a branch taken on an answer that the recorder's stand-in did not take) has no stored reply:
   the sample is not judged ("unsupported", with that reason in the detail; it scores 0 and the
   verifier counts and lists it).

Both runs of the tests start from the same `random` seed, so tests that draw random inputs
(HumanEval/53) make the same calls twice. Limits of the approach: tests that make a call only
when an answer is false or empty (a loop that stops on a result), only when the candidate
raised (a call in an `except` block), or on an argument they changed after the candidate
answered, are unsupported; every HumanEval problem's tests collect completely (the canonical
solutions all pass, tests/verify/test_tasks_verifiers.py). docs/verifier.md lists where the verdict
still differs from running the tests in-process.
"""
from __future__ import annotations

import ast
import random
import sys

if __package__:
  from orl_sandbox import wire
else:   # loaded by path by the sandbox runner, which loads the codec first
  wire = sys.modules["_orl_sandbox_script_wire"]

MAX_CALLS = 100_000
_SEED = 0


class ProtocolViolation(BaseException):
  """The sample broke the protocol or could not answer a call; a BaseException so that
  `except Exception` in the tests cannot swallow it."""


class JudgeOverloaded(BaseException):
  """The runner ran out of its CPU time while it moved the sample's bytes (raised by its
  SIGXCPU handler; never inside the tests: the phases that run them are killed by the kernel
  at their CPU limit)."""


class _Opaque:
  """What a call returns while calls are collected: true, equal to and ordered like anything,
  an empty iterable, 0 as a number, and the result of every operation on it."""

  def _self(self, *args, **kwargs):
    return self

  def _true(self, *args):
    return True

  __call__ = __getitem__ = __abs__ = __neg__ = __pos__ = __invert__ = __round__ = _self
  __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __matmul__ = _self
  __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _self
  __pow__ = __rpow__ = __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _self
  __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = __divmod__ = __rdivmod__ = _self
  __eq__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __bool__ = _true

  def __ne__(self, other):
    return False

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return self

  def __iter__(self):
    return iter(())

  def __len__(self):
    return 0

  def __hash__(self):
    return 0

  def __index__(self):
    return 0

  __int__ = __index__

  def __float__(self):
    return 0.0

  def __str__(self):
    return ""

  __format__ = lambda self, spec: ""   # noqa: E731

  def __repr__(self):
    return "<candidate answer>"


_OPAQUE = _Opaque()


class _KeepGoing(ast.NodeTransformer):
  """Rewrites test code so that every statement runs: `assert x` becomes `x`, and each statement
  is wrapped in `try: ... except Exception: pass` (in every block, at every depth)."""

  def _block(self, statements):
    out = []
    for statement in statements:
      statement = self.visit(statement)
      if isinstance(statement, ast.Assert):
        statement = ast.Expr(statement.test)
      if isinstance(statement, (ast.Global, ast.Nonlocal)):
        out.append(statement)
        continue
      handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None,
                                  body=[ast.Pass()])
      out.append(ast.Try(body=[statement], handlers=[handler], orelse=[], finalbody=[]))
    return out

  def generic_visit(self, node):
    for field in ("body", "orelse", "finalbody"):
      block = getattr(node, field, None)
      if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
        setattr(node, field, self._block(block))
    for handler in getattr(node, "handlers", ()):
      handler.body = self._block(handler.body)
    for case in getattr(node, "cases", ()):
      case.body = self._block(case.body)
    return node


def _keep_going(source: str, filename: str):
  tree = _KeepGoing().visit(ast.parse(source, filename))
  return compile(ast.fix_missing_locations(tree), filename, "exec")


def _encode_call(session, args, kwargs) -> bytes:
  """A call as message bytes (the exact form sent to the sample and compared on replay):
  arguments and keyword values through `session`, which numbers each container the tests pass
  and sends its contents only when new or changed since the sample last saw it."""
  part = session.encode(list(args) + list(kwargs.values()))
  return wire.dumps({"call": {"part": part, "kw": [str(k) for k in kwargs]}})


class _Recorder:
  """Stands for the candidate in step 1: records each call's message bytes. With `alone`, each
  call is encoded in a fresh session, so its bytes are its arguments' values alone (not which
  containers an earlier call sent): the form `call_set_digest` compares."""

  def __init__(self, alone: bool = False):
    self.calls: list[bytes] = []
    self.alone = alone
    self.session = wire.Session(0, watch_received=False)

  def __call__(self, *args, **kwargs):
    if self.alone:
      self.session = wire.Session(0, watch_received=False)
    try:
      self.calls.append(_encode_call(self.session, args, kwargs))
    except (wire.WireError, wire.Unsupported, RecursionError, ValueError, TypeError):
      pass   # arguments that hold an answer (or are not data): not known in advance
    if len(self.calls) > MAX_CALLS:
      raise ProtocolViolation(f"the tests make more than {MAX_CALLS} calls")
    return _OPAQUE


def _run_tests(prelude: str, tests, entry_point: str, candidate) -> None:
  """The prompt (errors ignored: tests may use its helpers), then the tests, then `check`.
  The candidate's session resolves class names in the tests' namespace (the prompt's enums,
  named tuples and exceptions)."""
  namespace: dict = {}   # no __name__, as in the usual harness's `exec(program, {})`
  candidate.session.namespace = namespace
  random.seed(_SEED)
  try:
    exec(compile(prelude, "prompt.py", "exec"), namespace)  # pylint: disable=exec-used
  except Exception:  # pylint: disable=broad-except
    pass   # a prompt whose stub does not run on its own: tests then cannot use its helpers
  stub = namespace.get(entry_point)   # the prompt's function: the candidate's name and doc
  for name in ("__name__", "__qualname__", "__doc__"):
    setattr(candidate, name, getattr(stub, name, entry_point if name != "__doc__" else None))
  namespace[entry_point] = candidate
  exec(tests, namespace)  # pylint: disable=exec-used
  namespace["check"](candidate)


def collect_calls(prelude: str, tests: str, entry_point: str, alone: bool = False) -> list[bytes]:
  """Step 1: the calls the tests make on the path of a passing candidate, in order (`alone`:
  each encoded on its own, see `_Recorder`)."""
  recorder = _Recorder(alone)
  try:
    _run_tests(prelude, _keep_going(tests, "tests.py"), entry_point, recorder)
  except (Exception, ProtocolViolation):  # pylint: disable=broad-except
    pass   # e.g. `check` missing, too many calls: step 3 reports it
  return recorder.calls


def call_set_digest(prelude: str, tests: str, entry_point: str) -> str:
  """sha256 over the distinct calls the tests make, each encoded on its own, in sorted order:
  what the tests ask the candidate, whatever their wording, the order of their asserts or how
  often they repeat a call (the "prompt" isolation's key, orl_jax/verify/humaneval.py
  `prompt_key`)."""
  import hashlib  # pylint: disable=import-outside-toplevel
  digest = hashlib.sha256()
  for call in sorted(set(collect_calls(prelude, tests, entry_point, alone=True))):
    digest.update(len(call).to_bytes(8, "little") + call)
  return digest.hexdigest()


def exchange(calls: list[bytes], to_sample: int, from_sample: int, max_message_bytes: int,
             max_reply_bytes: int) -> tuple[list[bytes], str]:
  """Step 2: sends `calls` one at a time and keeps the raw replies, unread. Stops early only at
  the sample's end of output, a malformed frame, or replies past `max_reply_bytes` in all.
  Returns (replies, why it stopped early or "")."""
  replies: list[bytes] = []
  total = 0
  for call in calls:
    try:
      wire.write_all(to_sample, call)
      reply = wire.read_frame(from_sample, min(max_message_bytes, max_reply_bytes - total))
    except (OSError, wire.WireError) as error:
      return replies, f"broken exchange with the sample: {error}"
    if reply is None:
      return replies, "the sample exited during a call"
    total += len(reply)
    replies.append(reply)
  return replies, ""


class _Replay:
  """Stands for the candidate in step 3: hands out the stored replies in order, applying the
  sample's changes to the arguments (its session mirrors the sample's)."""

  def __init__(self, calls: list[bytes], replies: list[bytes], stopped: str):
    self.calls, self.replies, self.stopped = calls, replies, stopped
    self.session = wire.Session(0)
    self.count = 0
    self.violation = ""
    self.unsupported = False

  def _violate(self, why: str, unsupported: bool = False):
    if not self.violation:
      self.violation, self.unsupported = why, unsupported
    raise ProtocolViolation(self.violation)

  def __call__(self, *args, **kwargs):
    if self.violation:
      raise ProtocolViolation(self.violation)
    index, self.count = self.count, self.count + 1
    try:
      call = _encode_call(self.session, args, kwargs)
    except (wire.WireError, wire.Unsupported, RecursionError, ValueError, TypeError) as error:
      self._violate(f"the tests pass an argument that is not data: {error}", unsupported=True)
    if index >= len(self.calls) or call != self.calls[index]:
      self._violate(f"call {index + 1} of the tests was not known before the sample answered "
                    "(its arguments or its place depend on an earlier answer)", unsupported=True)
    if index >= len(self.replies):
      self._violate(self.stopped or "the sample did not answer")
    return self._answer(self.replies[index])

  def _answer(self, payload: bytes):
    how = value = None
    try:
      reply = wire.loads(payload)
      how = next((k for k in ("return", "raise") if k in reply), None)
      if how is not None and set(reply) == {how}:
        values = self.session.decode(reply[how])
        value = values[0] if len(values) == 1 else None
        how = how if len(values) == 1 else None
    except wire.Unsupported:
      self._violate(self.session.unsupported, unsupported=True)
    except (wire.WireError, RecursionError, MemoryError, IndexError) as error:
      self._violate(f"the sample's answer is not data within the limits: {error}")
    if set(reply) == {"unsupported"}:
      self._violate(str(reply["unsupported"])[:1000], unsupported=True)
    if set(reply) == {"abort"}:
      self._violate(str(reply["abort"])[:1000])
    if how is None or set(reply) != {how} or (
        how == "raise" and not isinstance(value, Exception)):
      self._violate("malformed reply")
    if how == "raise":
      raise value   # (outside the `try`: the candidate's own RecursionError or MemoryError)
    return value


def replay_verdict(prelude: str, tests: str, entry_point: str, calls: list[bytes],
                   replies: list[bytes], stopped: str) -> tuple[str, str]:
  """Step 3 (the sample is dead): ("pass" | "fail" | "unsupported", detail) of the unmodified
  tests. "unsupported": the tests made a call the judge could not know before the sample
  answered, or passed an argument that is not data; the sample is not judged."""
  import traceback  # pylint: disable=import-outside-toplevel
  replay = _Replay(calls, replies, stopped)
  try:
    _run_tests(prelude, compile(tests, "tests.py", "exec"), entry_point, replay)
  except MemoryError:
    return "fail", "the judge's memory limit ran out while checking the sample's answers"
  except BaseException as error:  # pylint: disable=broad-except
    if not replay.violation and not replay.session.unsupported:
      lines = traceback.format_exception_only(type(error), error)
      return "fail", ("".join(lines).strip() or type(error).__name__)[-1000:]
  if replay.session.unsupported and not replay.violation:
    return "unsupported", f"not judged: {replay.session.unsupported}"
  if replay.violation:
    if replay.unsupported:
      return "unsupported", f"not judged: {replay.violation}"
    return "fail", f"protocol violation: {replay.violation}"
  return "pass", f"{replay.count} calls"
