"""Which code-task tests the judge can judge as in-process Python; the rest are refused at load
(docs/verifier.md#what-the-judge-supports).

The judge runs a task's tests in its own process and the candidate in the sandbox, the tests
twice (collecting the calls, then replaying the answers). Tests that time the candidate, run
threads or processes beside it, change an interpreter setting it would see in-process, or loop
until an answer ends the loop cannot be judged there with in-process Python's verdict, so the
task loader refuses them with one sentence (`refusal`) naming the construct and its line, rather
than have every sample of the task scored wrong. Only the tests' text is read (`ast`); names are
resolved through the tests' imports (`import time as t`, `from time import perf_counter as pc`).
"""
from __future__ import annotations

import ast
import dataclasses

_CLOCK = "the judge cannot time the candidate where it runs; remove the timing"
_CONCURRENT = ("the judge cannot run threads, processes, signals or event loops beside the "
               "candidate; call the candidate directly")
_SETTING = ("in-process the candidate would run under it, but the judge cannot apply it where "
            "the candidate runs; remove it")
_PATCH = ("in-process the candidate would see the patched name, but the candidate runs in "
          "another process; pass the input as an argument")

# Modules whose import alone is refused (what they are for cannot run beside the candidate).
_MODULES = {"threading": _CONCURRENT, "_thread": _CONCURRENT, "concurrent": _CONCURRENT,
            "multiprocessing": _CONCURRENT, "subprocess": _CONCURRENT, "asyncio": _CONCURRENT,
            "signal": _CONCURRENT, "pty": _CONCURRENT, "timeit": _CLOCK}
_CLOCKS = ("time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns",
           "time.monotonic", "time.monotonic_ns", "time.process_time", "time.process_time_ns",
           "time.thread_time", "time.thread_time_ns", "time.clock_gettime",
           "time.clock_gettime_ns", "datetime.datetime.now", "datetime.datetime.utcnow",
           "datetime.datetime.today", "datetime.date.today", "os.times", "resource.getrusage")
# Clock readings only when called without the time they format.
_CLOCKS_WITHOUT_ARGUMENT = {"time.localtime": 0, "time.gmtime": 0, "time.ctime": 0,
                            "time.asctime": 0, "time.strftime": 1}
_PROCESSES = ("os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn",
              "os.posix_spawnp", "os.kill", "os.killpg", "os.execv", "os.execve", "os.execl",
              "os.execle", "os.execlp", "os.execlpe", "os.execvp", "os.execvpe", "os.spawnl",
              "os.spawnle", "os.spawnlp", "os.spawnlpe", "os.spawnv", "os.spawnve",
              "os.spawnvp", "os.spawnvpe")
_SETTINGS = ("sys.setrecursionlimit", "sys.set_int_max_str_digits", "sys.settrace",
             "sys.setprofile", "sys.setswitchinterval", "decimal.setcontext",
             "decimal.localcontext", "random.seed", "random.setstate", "locale.setlocale",
             "os.chdir", "os.putenv", "os.unsetenv", "os.umask")
_ENVIRONMENT = ("os.environ.update", "os.environ.pop", "os.environ.popitem",
                "os.environ.setdefault", "os.environ.clear")
_PATCHES = ("unittest.mock.patch", "unittest.mock.patch.object", "unittest.mock.patch.dict",
            "unittest.mock.patch.multiple")
_REFUSED = {**{name: _CLOCK for name in _CLOCKS}, **{name: _CONCURRENT for name in _PROCESSES},
            **{name: _SETTING for name in _SETTINGS + _ENVIRONMENT},
            **{name: _PATCH for name in _PATCHES}}
# `decimal.getcontext()` is refused unless only one of these is read from it.
_CONTEXT_READS = {"prec", "rounding", "Emin", "Emax", "capitals", "clamp"}
# Attributes whose assignment the candidate would see in-process.
_STORED = {"sys.stdin": _PATCH, "os.environ": _SETTING}
_STAR_NAMES = [*_REFUSED, *_CLOCKS_WITHOUT_ARGUMENT, "decimal.getcontext"]
_UNBOUNDED = {"itertools.count", "itertools.cycle", "iter"}


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a task's tests cannot be judged: `construct` at `line` of the tests, and `reason`."""
  construct: str
  line: int
  reason: str

  def sentence(self) -> str:
    return (f"its tests use {self.construct} (line {self.line} of the tests), and "
            f"{self.reason}")


def refusal(tests: str, entry_point: str) -> Refusal | None:
  """The first construct of `tests` the judge cannot judge exactly, or None (tests that do not
  parse are left to the judge, which fails every sample of them)."""
  try:
    tree = ast.parse(tests)
  except (SyntaxError, ValueError):
    return None
  parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
  names = _imported_names(tree)
  found = [r for node in ast.walk(tree) for r in [_construct(node, names, parents)] if r]
  found += _answer_loops(tree, entry_point, names)
  return min(found, key=lambda r: r.line) if found else None


def _imported_names(tree: ast.Module) -> dict[str, str]:
  """Local name -> the dotted name it stands for, from every import in the tests."""
  names: dict[str, str] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.asname:
          names[alias.asname] = alias.name
        else:
          top = alias.name.split(".")[0]
          names[top] = top
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        if alias.name == "*":
          names.update({q.rsplit(".", 1)[1]: q for q in _STAR_NAMES
                        if q.rsplit(".", 1)[0] == node.module})
        else:
          names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
  return names


def dotted(node: ast.AST, names: dict[str, str]) -> str | None:
  """The dotted name an expression stands for through the tests' imports (`t.perf_counter` ->
  'time.perf_counter' after `import time as t`), or None."""
  if isinstance(node, ast.Name):
    return names.get(node.id, "iter" if node.id == "iter" else None)
  if isinstance(node, ast.Attribute):
    base = dotted(node.value, names)
    return f"{base}.{node.attr}" if base else None
  return None


def _construct(node: ast.AST, names: dict[str, str], parents: dict) -> Refusal | None:
  """A refused import, call, reference or assignment at `node`, or None."""
  if isinstance(node, (ast.Import, ast.ImportFrom)):
    modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""])
    for module in modules:
      top = module.split(".")[0]
      if top in _MODULES:
        return Refusal(f"the {module} module", node.lineno, _MODULES[top])
    return None
  if isinstance(node, (ast.Name, ast.Attribute)) and not isinstance(parents.get(node),
                                                                    ast.Attribute):
    return _name_refusal(node, names, parents)   # (the outermost name of a dotted chain)
  return None


def _name_refusal(node: ast.Name | ast.Attribute, names: dict[str, str],
                  parents: dict) -> Refusal | None:
  name = dotted(node, names)
  if name is None:
    return None
  if isinstance(node.ctx, ast.Store) or _stored_into(node, parents):
    reason = _STORED.get(name) or (_PATCH if name.startswith("builtins.") else None)
    return Refusal(f"an assignment to {name}", node.lineno, reason) if reason else None
  parent = parents.get(node)
  call = parent if isinstance(parent, ast.Call) and parent.func is node else None
  if name in _REFUSED:
    return Refusal(name, node.lineno, _REFUSED[name])
  if name in _CLOCKS_WITHOUT_ARGUMENT and call is not None and len(
      call.args) <= _CLOCKS_WITHOUT_ARGUMENT[name]:
    return Refusal(f"{name} without a time", node.lineno, _CLOCK)
  if name == "decimal.getcontext" and not (call is not None and _reads_context(call, parents)):
    return Refusal("decimal.getcontext() to change the context", node.lineno, _SETTING)
  return None


def _stored_into(node: ast.AST, parents: dict) -> bool:
  """Whether an item of `node` is assigned or deleted (`os.environ[k] = v`)."""
  parent = parents.get(node)
  return isinstance(parent, ast.Subscript) and not isinstance(parent.ctx, ast.Load)


def _reads_context(call: ast.Call, parents: dict) -> bool:
  """Whether `getcontext()` only has one scalar setting read (`getcontext().prec`)."""
  parent = parents.get(call)
  return (isinstance(parent, ast.Attribute) and isinstance(parent.ctx, ast.Load)
          and parent.attr in _CONTEXT_READS)


_LOOP = ("its calls would depend on the candidate's answers, so the judge cannot replay them; "
         "bound the loop by a count")


def _answer_loops(tree: ast.Module, entry_point: str, names: dict[str, str]) -> list[Refusal]:
  """Loops that end on a candidate answer: a `while` whose condition, or a `while`/unbounded
  `for` whose `break`/`return`, depends on an answer (`_Answers`)."""
  answers = _Answers(tree, entry_point)
  found = []
  for loop, scope in answers.loops:
    if isinstance(loop, ast.While):
      if answers.depends(loop.test, scope):
        found.append(Refusal("a while loop on a candidate answer", loop.lineno, _LOOP))
        continue
    elif not (isinstance(loop.iter, ast.Call) and dotted(loop.iter.func, names) in _UNBOUNDED
              and (dotted(loop.iter.func, names) != "iter" or len(loop.iter.args) == 2)):
      continue
    if any(answers.depends(test, scope) for test in _exit_tests(loop)):
      found.append(Refusal("a loop that ends on a candidate answer", loop.lineno, _LOOP))
  return found


def _exit_tests(loop: ast.While | ast.For) -> list[ast.expr]:
  """Conditions of the `if`s in `loop`'s body (outside nested loops and functions) that hold a
  `break` or `return` of this loop."""
  tests: list[ast.expr] = []

  def visit(statements: list[ast.stmt], conditions: list[ast.expr]) -> None:
    for statement in statements:
      if isinstance(statement, (ast.Break, ast.Return)):
        tests.extend(conditions)
      elif isinstance(statement, ast.If):
        visit(statement.body, conditions + [statement.test])
        visit(statement.orelse, conditions + [statement.test])
      elif isinstance(statement, (ast.With, ast.Try)):
        for block in ("body", "orelse", "finalbody"):
          visit(getattr(statement, block, []), conditions)
        for handler in getattr(statement, "handlers", []):
          visit(handler.body, conditions)

  visit(loop.body, [])
  return tests


_Scope = ast.AST   # a module, function or lambda


class _Answers:
  """Which names of the tests hold a candidate answer (or the candidate), scope by scope: the
  `check` parameter and the entry point's name, then, to a fixed point, every name bound to an
  expression that mentions one, every object a method call is passed one, every parameter
  passed one, every function that returns one."""

  def __init__(self, tree: ast.Module, entry_point: str):
    self.bound: dict[_Scope, set[str]] = {}
    self.parent: dict[_Scope, _Scope | None] = {tree: None}
    self.bindings: list[tuple[_Scope, str, ast.AST]] = []   # (scope, name, value)
    self.changes: list[tuple[_Scope, str, ast.AST]] = []    # (scope, name, value put in it)
    self.defs: dict[tuple[_Scope, str], ast.FunctionDef | ast.AsyncFunctionDef] = {}
    self.calls: list[tuple[_Scope, ast.Call]] = []
    self.loops: list[tuple[ast.While | ast.For, _Scope]] = []
    self._collect(tree, tree)
    self.held: set[tuple[_Scope, str]] = {(tree, entry_point)}
    check = self.defs.get((tree, "check"))
    if check is not None and check.args.args:
      self.held.add((check, check.args.args[0].arg))
    self._spread()

  def _bind(self, scope: _Scope, target: ast.AST, value: ast.AST) -> None:
    for node in ast.walk(target):
      if isinstance(node, ast.Name):
        self.bound.setdefault(scope, set()).add(node.id)
        self.bindings.append((scope, node.id, value))

  def _collect(self, node: ast.AST, scope: _Scope) -> None:
    for child in ast.iter_child_nodes(node):
      inner = scope
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        inner = child
        self.parent[child] = scope
        params = [a.arg for a in child.args.posonlyargs + child.args.args
                  + child.args.kwonlyargs]
        self.bound.setdefault(child, set()).update(params)
        if not isinstance(child, ast.Lambda):
          self.bound.setdefault(scope, set()).add(child.name)
          self.defs[(scope, child.name)] = child
      elif isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = child.targets if isinstance(child, ast.Assign) else [child.target]
        for target in targets:
          self._bind(scope, target, child.value or ast.Constant(None))
          if isinstance(child, ast.AugAssign):
            self._bind(scope, target, target)
      elif isinstance(child, (ast.For, ast.comprehension)):
        self._bind(scope, child.target, child.iter)
      elif isinstance(child, ast.NamedExpr):
        self._bind(scope, child.target, child.value)
      elif isinstance(child, ast.withitem) and child.optional_vars is not None:
        self._bind(scope, child.optional_vars, child.context_expr)
      elif isinstance(child, ast.Call):
        self.calls.append((scope, child))
        if isinstance(child.func, ast.Attribute) and isinstance(child.func.value, ast.Name):
          # `answers.append(candidate(x))` puts an answer in `answers`
          self.changes.append((scope, child.func.value.id, ast.Tuple(child.args, ast.Load())))
      if isinstance(child, (ast.While, ast.For)):
        self.loops.append((child, scope))
      self._collect(child, inner)

  def _resolve(self, name: str, scope: _Scope | None) -> tuple[_Scope, str] | None:
    while scope is not None:
      if name in self.bound.get(scope, ()) or self.parent[scope] is None:
        return (scope, name)
      scope = self.parent[scope]
    return None

  def depends(self, expression: ast.AST, scope: _Scope) -> bool:
    """Whether `expression`, read in `scope`, mentions a name that holds an answer."""
    return any(isinstance(node, ast.Name) and self._resolve(node.id, scope) in self.held
               for node in ast.walk(expression))

  def _spread(self) -> None:
    changed = True
    while changed:
      before = len(self.held)
      for scope, name, value in self.bindings:
        if self.depends(value, scope):
          self.held.add((scope, name))
      for scope, name, value in self.changes:
        where = self._resolve(name, scope)
        if where is not None and self.depends(value, scope):
          self.held.add(where)
      for scope, call in self.calls:
        self._pass_into(scope, call)
      for (scope, name), function in self.defs.items():
        if any(isinstance(r, ast.Return) and r.value is not None
               and self.depends(r.value, function) for r in ast.walk(function)):
          self.held.add((scope, name))
      changed = len(self.held) != before

  def _pass_into(self, scope: _Scope, call: ast.Call) -> None:
    """Marks the parameters of a function of the tests that `call` passes an answer to."""
    if not isinstance(call.func, ast.Name):
      return
    where = self._resolve(call.func.id, scope)
    function = self.defs.get(where) if where else None
    if function is None:
      return
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    for param, argument in zip(params, call.args):
      if self.depends(argument, scope):
        self.held.add((function, param))
    for keyword in call.keywords:
      if keyword.arg and self.depends(keyword.value, scope):
        self.held.add((function, keyword.arg))
