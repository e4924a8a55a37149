"""Imports each named module of the project as the first of the project's modules in a process.

    python tests/scripts/import_each_first.py orl_jax.decode.build orl_jax.train.orl ...

prints one line `<module> ok` or `<module> failed: <traceback, escaped>` per module.
tests/project/test_fresh_imports.py runs it. The parent imports the third-party modules that
the project's modules import at their top (jax, flax, numpy, ...; never a module of the project)
and then forks a child per module, two at a time: each child starts with no module of the
project imported, as a fresh interpreter would, without paying for JAX's import again (about 1 s
each, most of the time of a fresh interpreter).
"""
from __future__ import annotations

import ast
import importlib
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT = ("orl_jax", "orl_sandbox", "pallas_kernels", "configs", "tests")
PARALLEL = 2


def third_party_imports(modules: list[str]) -> list[str]:
  """The modules outside the project imported at the top of the given project modules' files,
  sorted: a.b for `import a.b`; a.b and, in case c is a submodule, a.b.c for `from a.b import
  c`."""
  names = set()
  for module in modules:
    path = os.path.join(ROOT, *module.split("."))
    path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in tree.body:
      if isinstance(node, ast.Import):
        names.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names.add(node.module)
        names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return sorted(n for n in names if n.split(".")[0] not in PROJECT and n != "__future__")


def preload(names: list[str]) -> None:
  """Imports what imports here (a.b.c where c is no module fails and is dropped); a module that
  fails is left to the child that needs it."""
  for name in names:
    try:
      importlib.import_module(name)
    except Exception:                        # the child that needs it reports it
      pass


def start_child(module: str) -> tuple[int, int]:
  """Forks a child that imports `module` and writes its outcome to a pipe: (pid, read end)."""
  read, write = os.pipe()
  pid = os.fork()
  if pid:
    os.close(write)
    return pid, read
  os.close(read)
  try:
    importlib.import_module(module)
    message = "ok"
  except BaseException:                      # reported, not raised
    message = "failed: " + traceback.format_exc().encode("unicode_escape").decode()
  os.write(write, message.encode())
  os._exit(0)


def collect(pid: int, read: int) -> str:
  """The child's message once it has ended (a child killed before writing is a failure)."""
  chunks = []
  while chunk := os.read(read, 65536):
    chunks.append(chunk)
  os.close(read)
  _, status = os.waitpid(pid, 0)
  return b"".join(chunks).decode() or f"failed: the child ended with status {status}"


def main(modules: list[str]) -> None:
  assert not [m for m in sys.modules if m.split(".")[0] in PROJECT[:3]]
  preload(third_party_imports(modules))
  pending, running = list(modules), []
  while pending or running:
    while pending and len(running) < PARALLEL:
      module = pending.pop(0)
      running.append((module, *start_child(module)))
    module, pid, read = running.pop(0)
    print(module, collect(pid, read), flush=True)


if __name__ == "__main__":
  sys.path.insert(0, ROOT)
  main(sys.argv[1:])
