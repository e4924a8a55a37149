"""Which code-task tests are inside the judge's contract; the rest are refused at load
(docs/verifier.md#what-a-test-may-use).

The contract: a test observes the candidate only through the values its calls return and the
exceptions they raise, and computes with plain data. The judge runs the tests in its own
process and the candidate in the sandbox, the tests twice (collecting the calls, then replaying
the answers), so a test that reads a clock, a file, the environment or an interpreter setting,
runs threads, inspects the candidate object, or reaches a name through `__import__`, `getattr`,
`importlib`, `sys.modules` or an alias could see something in-process Python would not show it
the same way. `refusal` reads the tests' text (`ast`) against an **allowlist**: the syntax a
test may use (`_CONSTRUCTS`), the builtins (`BUILTINS`), the modules and, per module, the names
(`MODULES`), and any public attribute of a value (never one that starts with `_`). Whatever the
list does not name is refused with one sentence naming it and its line, so a construct the rule
has not seen is refused, never misjudged. Loops that end on an answer are refused too: their
calls cannot be known before the sample answers (`_answer_loops`); and so is what the judge,
whose values cross as plain data by value, could not reproduce: an identity test other than
against None, True, False or Ellipsis, an exception bound to a name (`except ... as e`), and
the candidate used other than by calling it. An argument the tests keep after the call needs
the values: the judge's collection refuses it (`orl_sandbox/judge.py`, `_Kept`), run at load by
`humaneval.kept_argument_refusals`.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import string

_REASON = ("a test may observe the candidate only through the values its calls return and the "
           "exceptions they raise, with the modules, builtins and constructs that "
           "docs/verifier.md#what-a-test-may-use lists; remove it")
_EVERY = None   # every public name of the module (pure functions and constants only)

# Module -> the names a test may take from it (`_EVERY`: all its public names).
MODULES: dict[str, frozenset[str] | None] = {
    "math": _EVERY, "cmath": _EVERY, "itertools": _EVERY, "heapq": _EVERY, "bisect": _EVERY,
    "statistics": _EVERY,
    "string": frozenset(n for n in dir(string) if not n.startswith("_")
                        and n != "Formatter"),   # (its get_field reads attributes by name)
    "operator": frozenset(n for n in dir(__import__("operator")) if not n.startswith("_")
                          and n not in ("attrgetter", "methodcaller")),   # names as strings
    "collections": frozenset(("Counter", "OrderedDict", "defaultdict", "deque", "namedtuple",
                              "ChainMap")),
    "functools": frozenset(("reduce", "cmp_to_key", "partial")),
    "copy": frozenset(("copy", "deepcopy")),
    "fractions": frozenset(("Fraction",)),
    "decimal": frozenset(("Decimal", "InvalidOperation", "DivisionByZero", "ROUND_UP",
                          "ROUND_DOWN", "ROUND_CEILING", "ROUND_FLOOR", "ROUND_HALF_UP",
                          "ROUND_HALF_DOWN", "ROUND_HALF_EVEN", "ROUND_05UP")),
    "random": frozenset(("Random", "random", "randint", "randrange", "choice", "choices",
                         "shuffle", "sample", "uniform", "gauss")),
    "re": frozenset(("compile", "match", "search", "fullmatch", "findall", "finditer", "sub",
                     "subn", "split", "escape", "error", "IGNORECASE", "I", "MULTILINE", "M",
                     "DOTALL", "S", "VERBOSE", "X", "ASCII", "A")),
    "json": frozenset(("loads", "dumps")),
    "typing": frozenset(("Any", "Callable", "Dict", "FrozenSet", "Iterable", "Iterator", "List",
                         "Mapping", "Optional", "Sequence", "Set", "Tuple", "Union")),
    "time": frozenset(("sleep",)),
    "sys": frozenset(("maxsize", "float_info")),
}
_EXCEPTIONS = frozenset(name for name in dir(builtins) if isinstance(getattr(builtins, name), type)
                        and issubclass(getattr(builtins, name), BaseException))
# The builtins a test may name: data, arithmetic, iteration, output to its own streams, and the
# exception classes (not `getattr`, `vars`, `globals`, `eval`, `exec`, `open`, `__import__`,
# `id`, `hasattr`, `input`, ...).
BUILTINS = frozenset((
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
    "complex", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash",
    "hex", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
    "object", "oct", "ord", "pow", "print", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "str", "sum", "tuple", "type", "zip", "Ellipsis", "NotImplemented")) | _EXCEPTIONS

# Syntax a test may use; every other node type is refused (with its `_NAMES` wording).
_CONSTRUCTS = tuple(getattr(ast, name) for name in (
    "Module", "FunctionDef", "Return", "Delete", "Assign", "AugAssign", "AnnAssign", "For",
    "While", "If", "Raise", "Try", "Assert", "Import", "ImportFrom", "Expr", "Pass", "Break",
    "Continue", "BoolOp", "NamedExpr", "BinOp", "UnaryOp", "Lambda", "IfExp", "Dict", "Set",
    "ListComp", "SetComp", "DictComp", "GeneratorExp", "Compare", "Call", "FormattedValue",
    "JoinedStr", "Constant", "Attribute", "Subscript", "Starred", "Name", "List", "Tuple",
    "Slice", "arguments", "arg", "keyword", "comprehension", "ExceptHandler", "alias",
    "expr_context", "boolop", "operator", "unaryop", "cmpop"))
_NAMES = {"ClassDef": "a class definition", "With": "a with statement", "Global": "a global "
          "statement", "Nonlocal": "a nonlocal statement", "Yield": "a generator (yield)",
          "YieldFrom": "a generator (yield from)", "AsyncFunctionDef": "an async function",
          "Await": "await", "AsyncFor": "an async for loop", "AsyncWith": "an async with "
          "statement", "Match": "a match statement", "TryStar": "an except* clause"}


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a task's tests cannot be judged: `construct` at `line` of the tests, and `reason`."""
  construct: str
  line: int
  reason: str

  def sentence(self) -> str:
    return (f"its tests use {self.construct} (line {self.line} of the tests), and "
            f"{self.reason}")


def refusal(tests: str, entry_point: str, prompt: str = "") -> Refusal | None:
  """The first construct of `tests` outside the contract, or None. `prompt` (the task's prompt,
  which the judge runs first) adds the names it defines and imports. Tests that do not parse
  are left to the judge, which fails every sample of them."""
  try:
    tree = ast.parse(tests)
  except (SyntaxError, ValueError):
    return None
  names = _imported_names(_prompt_tree(prompt))
  names.update(_imported_names(tree))
  found = [r for r in (_import_refusal(n) for n in ast.walk(tree)) if r]
  found += _Allowlist(tree, entry_point, names, _prompt_names(prompt)).refusals
  found += _answer_loops(tree, entry_point, names)
  return min(found, key=lambda r: r.line) if found else None


def _prompt_tree(prompt: str) -> ast.Module:
  """The prompt's syntax tree; a prompt that ends at a signature (`def f(x):`, the body left to
  the completion) is read with a `pass` body, as the completion would give it one."""
  for ending in ("", "    pass\n", "  pass\n", "\tpass\n", " pass\n"):
    try:
      return ast.parse(prompt + ending)
    except (SyntaxError, ValueError):
      continue
  return ast.Module(body=[], type_ignores=[])


def _prompt_names(prompt: str) -> set[str]:
  """Names the prompt binds at its top level (its helpers, constants and classes)."""
  tree = _prompt_tree(prompt)
  bound = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
  for statement in tree.body:
    if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
      bound |= {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Store)}
  return bound


def _imported_names(tree: ast.Module) -> dict[str, tuple[str, str]]:
  """Local name -> (module, name taken from it; "" for the module itself), from every import
  in `tree` (`import a.b` binds `a`)."""
  names: dict[str, tuple[str, str]] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        names[alias.asname or alias.name.split(".")[0]] = (
            alias.name if alias.asname else alias.name.split(".")[0], "")
    elif isinstance(node, ast.ImportFrom):
      for alias in node.names:
        names[alias.asname or alias.name] = ("." * node.level + (node.module or ""), alias.name)
  return names


def _import_refusal(node: ast.AST) -> Refusal | None:
  """An import of a module, or of a name from one, that `MODULES` does not list."""
  if isinstance(node, ast.Import):
    for alias in node.names:
      if alias.name not in MODULES:
        return Refusal(f"the {alias.name} module", node.lineno, _REASON)
  elif isinstance(node, ast.ImportFrom):
    if node.level or node.module not in MODULES:
      return Refusal(f"the {node.module or '.'} module", node.lineno, _REASON)
    for alias in node.names:
      if not _allowed(node.module, alias.name):
        construct = "import *" if alias.name == "*" else f"{node.module}.{alias.name}"
        return Refusal(construct, node.lineno, _REASON)
  return None


def _allowed(module: str, name: str) -> bool:
  listed = MODULES.get(module, frozenset())
  return not name.startswith("_") and name != "*" and (listed is _EVERY or name in listed)


class _Allowlist(ast.NodeVisitor):
  """Walks the tests and records, as `Refusal`s, every node type, name and attribute the
  allowlist does not name."""

  def __init__(self, tree: ast.Module, entry_point: str, names: dict[str, tuple[str, str]],
               prompt_names: set[str]):
    self.names = names
    self.candidates = _candidate_names(tree, {entry_point} | _check_parameter(tree))
    self.known = (BUILTINS | set(prompt_names) | {entry_point} | _bound_names(tree)) - set(names)
    self.parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    self.functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    self.refusals: list[Refusal] = []
    self.visit(tree)

  def _refuse(self, node: ast.AST, construct: str) -> None:
    self.refusals.append(Refusal(construct, getattr(node, "lineno", 1), _REASON))

  def generic_visit(self, node: ast.AST) -> None:
    if not isinstance(node, _CONSTRUCTS):
      kind = type(node).__name__
      self._refuse(node, _NAMES.get(kind, f"Python's {kind} syntax"))
    elif getattr(node, "decorator_list", None):
      self._refuse(node, "a decorator")
    elif isinstance(node, ast.comprehension) and node.is_async:
      self._refuse(node.target, "an async comprehension")
    else:
      super().generic_visit(node)

  def visit_Name(self, node: ast.Name) -> None:
    if isinstance(node.ctx, ast.Load) and node.id in self.candidates and not _called(
        node, self.parents.get(node), self.functions):
      self._refuse(node, f"the candidate as a value ({node.id} not called)")
    if not isinstance(node.ctx, ast.Load) or node.id in self.known:
      return
    parent = self.parents.get(node)
    module, name = self.names.get(node.id, ("", ""))
    if not module:
      self._refuse(node, f"the name {node.id}")
    elif name and not _allowed(module, name):
      self._refuse(node, f"{module}.{name}")
    elif not name and not (isinstance(parent, ast.Attribute) and parent.value is node):
      self._refuse(node, f"the {module} module as a value")

  def visit_Attribute(self, node: ast.Attribute) -> None:
    base = node.value
    if node.attr.startswith("_"):
      self._refuse(node, f"the attribute {node.attr}")
    elif isinstance(base, ast.Name) and base.id in self.candidates:
      self._refuse(node, f"an attribute of the candidate ({base.id}.{node.attr})")
    elif isinstance(base, ast.Name) and base.id not in self.known and self.names.get(
        base.id, ("", "x"))[1] == "":
      module = self.names[base.id][0]
      if not _allowed(module, node.attr):
        self._refuse(node, f"{module}.{node.attr}")
      elif not isinstance(node.ctx, ast.Load):   # in-process the candidate would see it
        self._refuse(node, f"an assignment to {module}.{node.attr}")
    self.generic_visit(node)

  def visit_Compare(self, node: ast.Compare) -> None:
    operands = [node.left] + node.comparators
    for at, op in enumerate(node.ops):
      if isinstance(op, (ast.Is, ast.IsNot)) and not any(
          isinstance(x, ast.Constant) and x.value in _SINGLETONS for x in operands[at:at + 2]):
        self._refuse(node, "an identity test (is / is not) other than against None, True, "
                     "False or Ellipsis")
    self.generic_visit(node)

  def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
    if node.name:
      self._refuse(node, f"an exception bound to a name (except ... as {node.name}: a test "
                   "may catch the candidate's exceptions by class only)")
    self.generic_visit(node)

  def visit_Call(self, node: ast.Call) -> None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map") and not (
        isinstance(func.value, ast.Constant) and not _reaches_attributes(func.value.value)):
      self._refuse(node, "a format string that reads attributes or items, or is not a literal")
    self.generic_visit(node)


_SINGLETONS = (None, True, False, Ellipsis)


def _called(node: ast.Name, parent: ast.AST | None, functions: set[str]) -> bool:
  """Whether a use of the candidate's name calls it, names it for another name (an alias, a
  parameter's default) or passes it to a function the tests define: the uses that keep every
  call a direct call, whose arguments the judge sees as they are passed."""
  if isinstance(parent, ast.Call):
    return parent.func is node or (isinstance(parent.func, ast.Name)
                                   and parent.func.id in functions and node in parent.args)
  return isinstance(parent, (ast.Assign, ast.arguments))


def _reaches_attributes(text) -> bool:
  """Whether a `str.format` template reads an attribute or an item of an argument."""
  try:
    fields = [f for _, f, _, _ in string.Formatter().parse(text) if f]
  except (ValueError, TypeError):
    return True
  return any("." in f or "[" in f for f in fields)


def _check_parameter(tree: ast.Module) -> set[str]:
  """The name of `check`'s first parameter (the candidate), if the tests define `check`."""
  return {node.args.args[0].arg for node in tree.body
          if isinstance(node, ast.FunctionDef) and node.name == "check" and node.args.args}


def _candidate_names(tree: ast.Module, names: set[str]) -> set[str]:
  """`names` and every name that ever holds one of them (by name, whatever the scope): an
  assignment of one, a parameter given one as its default or as an argument of a call of the
  tests' own function. Their attributes would be the judge's stand-in's, not the candidate's."""
  functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
  names = set(names)
  while True:
    found = set(names)
    for node in ast.walk(tree):
      if isinstance(node, ast.Assign) and _is_one_of(node.value, found):
        found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
      elif isinstance(node, ast.arguments):
        params = node.posonlyargs + node.args
        found |= {p.arg for p, d in zip(params[len(params) - len(node.defaults):], node.defaults)
                  if _is_one_of(d, found)}
      elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
          node.func.id in functions):
        params = functions[node.func.id].args.posonlyargs + functions[node.func.id].args.args
        found |= {p.arg for p, a in zip(params, node.args) if _is_one_of(a, found)}
    if found == names:
      return names
    names = found


def _is_one_of(node: ast.AST, names: set[str]) -> bool:
  return isinstance(node, ast.Name) and node.id in names


def _bound_names(tree: ast.Module) -> set[str]:
  """Every name the tests bind: assignments, loop and comprehension targets, functions and
  their parameters, `except ... as` names (imports are `_imported_names`)."""
  bound: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
      bound.add(node.id)
    elif isinstance(node, ast.FunctionDef):
      bound.add(node.name)
    elif isinstance(node, ast.arg):
      bound.add(node.arg)
    elif isinstance(node, ast.ExceptHandler) and node.name:
      bound.add(node.name)
  return bound


def dotted(node: ast.AST, names: dict[str, tuple[str, str]]) -> str | None:
  """The dotted name an expression stands for through the tests' imports (`it.count` ->
  'itertools.count' after `import itertools as it`), or None."""
  if isinstance(node, ast.Name):
    if node.id in names:
      module, name = names[node.id]
      return f"{module}.{name}" if name else module
    return "iter" if node.id == "iter" else None
  if isinstance(node, ast.Attribute):
    base = dotted(node.value, names)
    return f"{base}.{node.attr}" if base else None
  return None


_UNBOUNDED = {"itertools.count", "itertools.cycle", "iter"}


_LOOP = ("its calls would depend on the candidate's answers, so the judge cannot replay them; "
         "bound the loop by a count")


def _answer_loops(tree: ast.Module, entry_point: str,
                  names: dict[str, tuple[str, str]]) -> list[Refusal]:
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
