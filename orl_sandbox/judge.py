"""The judge's side of `run_judged`: tests that reveal nothing about correctness to the sample.

A sample that learns, while it runs, whether its answers were right can tell other samples (a
probe that the rest copy). With the usual harness it learns it from the calls themselves: the
tests stop at the first failed assert, so a next call arrives only after a right answer. Here
the calls the sample sees are fixed before it answers any, and the verdict is computed only
after its processes are dead, in three steps:

1. `collect` (before any answer): the tests run against a recorder. Every call returns
   `_Opaque`, a stand-in that is true, equal to anything and absorbs every operation, so the
   tests follow the path a passing candidate takes; the tests are rewritten so that an assert
   never fails and a statement that raises does not stop the ones after it
   (`_keep_going`). The result is the list of calls, in order, and the sentence refusing the
   tests if they pass an argument they can still reach after the call (`_Kept`).
2. `exchange`: the sample answers exactly that list, one call at a time; the judge stores the raw
   replies (capped in size) without looking at them. The sample is then killed.
3. `replay_verdict` (the sample dead): the prompt and the *unmodified* tests run again with a
   proxy that hands out the stored replies in order. Values cross as plain data, by value
   (`wire`): each answer is decoded into new objects, an exception crosses as its class only
   (the prompt's class of that name, else the nearest built-in class), and an answer that is
   not plain data (a generator, a named tuple, a class instance) fails the sample whatever the
   tests do with the call. A call that step 1 could not know in advance (its arguments depend
   on an earlier answer, `candidate(candidate(x))`, or on a branch taken on an answer that the
   recorder's stand-in did not take) has no stored reply: the sample is not judged
   ("unsupported", with that reason in the detail; it scores 0 and the verifier counts it).

Both runs of the tests start from the same `random` seed, so tests that draw random inputs
(HumanEval/53) make the same calls twice. The task loader refuses, before any sample, tests
whose verdict the plain-data replay could not reproduce exactly (`orl_jax.verify.test_support`
and the kept-argument check here); every HumanEval problem's tests are inside the contract (the
canonical solutions all pass, tests/verify/test_tasks_verifiers.py). docs/verifier.md#the-contract
says what a test may observe.
"""
from __future__ import annotations

import ast
import opcode
import random
import sys

if __package__:
  from orl_sandbox import wire
else:   # loaded by path by the sandbox runner, which loads the codec first
  wire = sys.modules["_orl_sandbox_script_wire"]

MAX_CALLS = 100_000
_CALL_STARRED = opcode.opmap["CALL_FUNCTION_EX"]   # `f(*args)`, `f(**kwargs)`
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


def _encode_call(args, kwargs) -> bytes:
  """A call as message bytes (the exact form sent to the sample and compared on replay): its
  arguments' values (plain data, `wire.encode`) and its keyword names."""
  values = [wire.encode(v) for v in list(args) + list(kwargs.values())]
  return wire.dumps({"call": {"args": values, "kw": [str(k) for k in kwargs]}})


_MUTABLE = (list, dict, set, bytearray)


def _references(value, out: list, depth: int) -> None:
  """Appends (object, references to it, depth) for each mutable container inside `value`
  (depth first); references counted here, by the same frames for every call (`_Kept`)."""
  kind = type(value)
  if depth > wire.MAX_DEPTH or kind not in _MUTABLE + (tuple,):
    return
  if kind is not tuple:
    out.append((value, sys.getrefcount(value), depth))
  if kind is list or kind is tuple:
    for item in value:
      _references(item, out, depth + 1)
  elif kind is dict:
    for item in value.values():
      _references(item, out, depth + 1)


class _Kept:
  """Finds an argument the tests can still reach after the call (docs/verifier.md#what-crosses):
  a mutable container inside the arguments with more references than the same container
  passed fresh (`candidate([1, 2])`) has, or one held twice. The baselines are measured on
  probes made the ways the tests make calls (with and without keywords, `*`/`**` or not), so
  no interpreter's counts are written here. A bare name that the tests never read again after
  the call (`_dead_names`) may hold its argument."""

  def __init__(self, dead: set):
    self.dead = dead
    self.baselines: dict = {}
    self.probing: tuple | None = None

  def calibrate(self, probe) -> None:
    """Makes the probe calls (each call reaches `measure` while `probing` is set)."""
    for starred, keywords in ((False, False), (False, True), (True, False), (True, True)):
      self.probing = (starred, keywords)
      if starred and keywords:
        probe(*[[], [[]]], **{"k": []})
      elif starred:
        probe(*[[], [[]]])
      elif keywords:
        probe([], [[]], k=[])
      else:
        probe([], [[]])
    self.probing = None

  def measure(self, args, kwargs) -> None:
    found = _argument_references(args, kwargs)
    counts = {(where if keyword else 0, depth): refs for where, keyword, _, refs, depth in found}
    self.baselines[self.probing] = (counts[(0, 0)], counts[(0, 1)], counts.get(("k", 0)))
    del found

  def refusal(self, args, kwargs, frame) -> str:
    """The sentence for the first kept argument of a call made from `frame`, or ""."""
    line = frame.f_lineno
    starred = frame.f_code.co_code[frame.f_lasti] == _CALL_STARRED
    positional, nested, keyword = self.baselines[(starred, bool(kwargs))]
    found = _argument_references(args, kwargs)
    seen: set[int] = set()
    for where, is_keyword, obj, refs, depth in found:
      expected = nested if depth else keyword if is_keyword else positional
      if depth == 0 and not starred and (line, where) in self.dead:
        expected += 1
      if refs > expected or id(obj) in seen:
        place = f"keyword {where}" if is_keyword else f"argument {where + 1}"
        return (f"its tests pass the candidate a {type(obj).__name__} that they can still "
                f"reach after the call ({place} of the call on line {line} of the tests), so "
                "they could see what the candidate does to it; pass a fresh value (a display, "
                "copy.deepcopy(x), list(x))")
      seen.add(id(obj))
    return ""


def _argument_references(args, kwargs) -> list:
  """(index or keyword, whether a keyword, object, references, depth) for each mutable
  container inside a call's arguments, counted the same way for the probe and every call."""
  found: list = []
  for index, value in enumerate(args):
    part: list = []
    _references(value, part, 0)
    found += [(index, False, *entry) for entry in part]
  for name, value in kwargs.items():
    part = []
    _references(value, part, 0)
    found += [(name, True, *entry) for entry in part]
  return found


class _Recorder:
  """Stands for the candidate in step 1: records each call's message bytes, and the first
  argument the tests keep (`_Kept`)."""

  def __init__(self, dead: set):
    self.calls: list[bytes] = []
    self.kept = _Kept(dead)
    self.refusal = ""
    self.kept.calibrate(self)

  def __call__(self, *args, **kwargs):
    if self.kept.probing is not None:
      self.kept.measure(args, kwargs)
      return None
    if not self.refusal:
      self.refusal = self.kept.refusal(args, kwargs, sys._getframe(1))
    try:
      self.calls.append(_encode_call(args, kwargs))
    except (wire.WireError, RecursionError, ValueError, TypeError):
      pass   # arguments that hold an answer (or are not data): not known in advance
    if len(self.calls) > MAX_CALLS:
      raise ProtocolViolation(f"the tests make more than {MAX_CALLS} calls")
    return _OPAQUE


def _run_tests(prelude: str, tests, entry_point: str, candidate) -> None:
  """The prompt (errors ignored: tests may use its helpers), then the tests, then `check`.
  The candidate's `namespace` is the tests' (the prompt's exception classes, by name)."""
  namespace: dict = {}   # no __name__, as in the usual harness's `exec(program, {})`
  candidate.namespace = namespace
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


def collect(prelude: str, tests: str, entry_point: str) -> tuple[list[bytes], str]:
  """Step 1: the calls the tests make on the path of a passing candidate, in order, and the
  sentence refusing the tests when they keep an argument ("" when none)."""
  try:
    dead = _dead_names(ast.parse(tests, "tests.py"))
  except (SyntaxError, ValueError):
    dead = {}
  recorder = _Recorder(dead)
  try:
    _run_tests(prelude, _keep_going(tests, "tests.py"), entry_point, recorder)
  except (Exception, ProtocolViolation):  # pylint: disable=broad-except
    pass   # e.g. `check` missing, too many calls: step 3 reports it
  return recorder.calls, recorder.refusal


def collect_calls(prelude: str, tests: str, entry_point: str) -> list[bytes]:
  """The calls of `collect`."""
  return collect(prelude, tests, entry_point)[0]


def call_set_digest(prelude: str, tests: str, entry_point: str) -> str:
  """sha256 over the distinct calls the tests make, in sorted order: what the tests ask the
  candidate, whatever their wording, the order of their asserts or how often they repeat a call
  (the "prompt" isolation's key, orl_jax/verify/humaneval.py `prompt_key`)."""
  import hashlib  # pylint: disable=import-outside-toplevel
  digest = hashlib.sha256()
  for call in sorted(set(collect_calls(prelude, tests, entry_point))):
    digest.update(len(call).to_bytes(8, "little") + call)
  return digest.hexdigest()


def _scopes(tree: ast.Module):
  """(node, its scope, the loops around it within that scope) for every node of `tree`."""
  stack = [(tree, tree, ())]
  while stack:
    node, scope, loops = stack.pop()
    yield node, scope, loops
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        stack.append((child, child, ()))
      elif isinstance(child, (ast.For, ast.While, ast.comprehension)):
        stack.append((child, scope, loops + (child,)))
      else:
        stack.append((child, scope, loops))


def _dead_names(tree: ast.Module) -> set:
  """{(line, argument index or keyword)} of the call arguments that are a bare name the tests
  never read after the call: no read of it later in its function (or, at the top level, later
  in the module outside functions), none in a nested function, and none inside a loop around
  the call. A call spread over lines is listed at each of its lines; a place where any call's
  name is still read is left out."""
  nodes = list(_scopes(tree))
  reads: dict = {}
  for node, scope, _ in nodes:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
      reads.setdefault(node.id, []).append((node, scope))
  inside = {id(n): loops for n, _, loops in nodes}
  dead: set = set()
  live: set = set()
  for call, scope, loops in nodes:
    if not isinstance(call, ast.Call):
      continue
    places = [(i, a) for i, a in enumerate(call.args)] + [(k.arg, k.value) for k in call.keywords]
    for where, argument in places:
      if not isinstance(argument, ast.Name):
        continue
      end = (call.end_lineno or call.lineno, call.end_col_offset or 0)
      alive = any(read is not argument and (
          other is not scope or (read.lineno, read.col_offset) > end
          or any(loop in inside[id(read)] for loop in loops))
          for read, other in reads.get(argument.id, ()))
      for line in range(call.lineno, (call.end_lineno or call.lineno) + 1):
        (live if alive else dead).add((line, where))
  return dead - live


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
  """Stands for the candidate in step 3: hands out the stored replies in order, each decoded
  afresh (`wire.decode`, one hashing `wire.Budget` for them all)."""

  def __init__(self, calls: list[bytes], replies: list[bytes], stopped: str):
    self.calls, self.replies, self.stopped = calls, replies, stopped
    self.budget = wire.Budget()
    self.namespace: dict = {}
    self.count = 0
    self.violation = ""
    self.kind = ""

  def _violate(self, why: str, kind: str = "protocol"):
    """Ends the tests with a verdict they cannot catch ("protocol", "unsupported", "wrong")."""
    if not self.violation:
      self.violation, self.kind = why, kind
    raise ProtocolViolation(self.violation)

  def __call__(self, *args, **kwargs):
    if self.violation:
      raise ProtocolViolation(self.violation)
    index, self.count = self.count, self.count + 1
    try:
      call = _encode_call(args, kwargs)
    except (wire.WireError, RecursionError, ValueError, TypeError) as error:
      self._violate(f"the tests pass an argument that is not data: {error}", "unsupported")
    if index >= len(self.calls) or call != self.calls[index]:
      self._violate(f"call {index + 1} of the tests was not known before the sample answered "
                    "(its arguments or its place depend on an earlier answer)", "unsupported")
    if index >= len(self.replies):
      self._violate(self.stopped or "the sample did not answer")
    return self._answer(self.replies[index], index)

  def _answer(self, payload: bytes, index: int):
    try:
      reply = wire.loads(payload)
      how = next((k for k in ("return", "raise", "notdata", "abort") if k in reply), None)
      if how is None or set(reply) != {how}:
        self._violate("malformed reply")
      if how == "abort":
        self._violate(str(reply["abort"])[:1000])
      if how == "return":
        return wire.decode(reply["return"], self.budget)
      if how == "notdata":   # a wrong answer, whatever the tests do with the call
        self._violate(f"the answer to call {index + 1} is not plain data, so it is judged "
                      f"wrong: {str(reply['notdata'])[:300]}", "wrong")
      raised = self._exception(reply["raise"])
    except (wire.WireError, RecursionError, MemoryError, IndexError) as error:
      self._violate(f"the sample's answer is not data within the limits: {error}")
    raise raised   # (outside the `try`: the candidate's own RecursionError or MemoryError)

  def _exception(self, described) -> Exception:
    """The exception the candidate raised, as its class only: the first of the prompt's classes
    named in its class hierarchy, else the nearest built-in exception class; a StopIteration
    is a RuntimeError, as in a generator (PEP 479): it would end the tests' loop over
    `map(candidate, ...)` silently."""
    import builtins  # pylint: disable=import-outside-toplevel
    if type(described) is not dict or set(described) != {"names", "builtin"} or type(
        described["names"]) is not list:
      raise wire.WireError("malformed exception")
    for name in described["names"][:wire.MAX_DEPTH]:
      found = self.namespace.get(name) if type(name) is str else None
      if isinstance(found, type) and issubclass(found, Exception):
        break
    else:
      found = vars(builtins).get(str(described["builtin"]))
      if not (isinstance(found, type) and issubclass(found, Exception)):
        raise wire.WireError("malformed exception class")
    if issubclass(found, (StopIteration, StopAsyncIteration)):   # would end a loop of the tests
      found = RuntimeError
    return found.__new__(found)


def replay_verdict(prelude: str, tests: str, entry_point: str, calls: list[bytes],
                   replies: list[bytes], stopped: str) -> tuple[str, str]:
  """Step 3 (the sample is dead): ("pass" | "fail" | "unsupported", detail) of the unmodified
  tests. "unsupported": the tests made a call the judge could not know before the sample
  answered, or passed an argument that is not data; the sample is not judged. An answer that
  is not plain data fails the sample whatever the tests do with it (recorded outside them)."""
  import traceback  # pylint: disable=import-outside-toplevel
  replay = _Replay(calls, replies, stopped)
  try:
    _run_tests(prelude, compile(tests, "tests.py", "exec"), entry_point, replay)
  except MemoryError:
    return "fail", "the judge's memory limit ran out while checking the sample's answers"
  except BaseException as error:  # pylint: disable=broad-except
    if not replay.violation:
      lines = traceback.format_exception_only(type(error), error)
      return "fail", ("".join(lines).strip() or type(error).__name__)[-1000:]
  if replay.kind == "unsupported":
    return "unsupported", f"not judged: {replay.violation}"
  if replay.kind == "wrong":
    return "fail", replay.violation
  if replay.violation:
    return "fail", f"protocol violation: {replay.violation}"
  return "pass", f"{replay.count} calls"
