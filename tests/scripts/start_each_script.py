"""Runs each named script with `--help` as `python SCRIPT --help` would, in a forked child.

    python tests/scripts/start_each_script.py launch/train.py benchmarks/moe.py ...

prints one JSON line {"script", "returncode", "output"} per script (stdout and stderr
together). tests/project/test_scripts_start.py runs it. As tests/scripts/import_each_first.py
does for modules, the parent imports the third-party modules that the project's modules and the
scripts import at their top, never a module of the project, and forks a child per script, two at
a time; the child sees what a fresh interpreter started as `python SCRIPT` sees: `sys.argv`, a
`sys.path` whose only project entry is the script's folder (a script must put the repository
on the path itself), no module of the project imported, `__name__ == "__main__"`.
"""
from __future__ import annotations

import ast
import json
import os
import runpy
import sys
import tempfile
import traceback

from import_each_first import PARALLEL, ROOT, preload, third_party_imports

PACKAGES = ("orl_jax", "orl_sandbox", "pallas_kernels")


def project_modules() -> list[str]:
  """Every module of the project's packages, as dotted names."""
  out = []
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      out += [os.path.relpath(os.path.join(folder, n), ROOT)[:-3].replace(os.sep, ".")
              .removesuffix(".__init__") for n in files if n.endswith(".py")]
  return sorted(out)


def script_imports(scripts: list[str]) -> list[str]:
  """The third-party modules the scripts import at their top (their folders' helper modules,
  e.g. `_common`, are the project's and stay out)."""
  names = set()
  for path in scripts:
    with open(path) as f:
      for node in ast.parse(f.read()).body:
        if isinstance(node, ast.Import):
          names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          names.add(node.module)
          names.update(f"{node.module}.{alias.name}" for alias in node.names)
  local = {os.path.splitext(n)[0] for p in scripts for n in os.listdir(os.path.dirname(p))}
  skip = local | set(PACKAGES) | {"__future__", "configs", "tests"}
  return sorted(n for n in names if n.split(".")[0] not in skip)


def start_child(path: str, base_path: list[str]) -> tuple[int, str]:
  """Forks a child that runs `path --help` with its output in a temporary file: (pid, file)."""
  fd, out_path = tempfile.mkstemp(suffix=".out")
  pid = os.fork()
  if pid:
    os.close(fd)
    return pid, out_path
  os.dup2(fd, 1)
  os.dup2(fd, 2)
  sys.stdout = os.fdopen(1, "w", buffering=1)
  sys.stderr = os.fdopen(2, "w", buffering=1)
  sys.argv = [path, "--help"]
  sys.path[:] = [os.path.dirname(path)] + base_path
  code = 0
  try:
    runpy.run_path(path, run_name="__main__")
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if not isinstance(e.code, (int, type(None))):
      print(e.code, file=sys.stderr)
  except BaseException:                      # printed as a fresh interpreter would
    traceback.print_exc()
    code = 1
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def collect(pid: int, out_path: str) -> tuple[int, str]:
  """The child's return code (a signal's as the negative signal number) and output."""
  _, status = os.waitpid(pid, 0)
  with open(out_path, errors="replace") as f:
    text = f.read()
  os.unlink(out_path)
  return os.waitstatus_to_exitcode(status), text


def main(scripts: list[str]) -> None:
  scripts = [os.path.abspath(p) for p in scripts]
  here = os.path.dirname(os.path.abspath(__file__))
  base_path = [p for p in sys.path if p not in ("", ROOT, here)]
  preload(third_party_imports(project_modules()) + script_imports(scripts))
  sys.path[:] = base_path
  pending, running = list(scripts), []
  while pending or running:
    while pending and len(running) < PARALLEL:
      path = pending.pop(0)
      running.append((path, *start_child(path, base_path)))
    path, pid, out_path = running.pop(0)
    code, text = collect(pid, out_path)
    print(json.dumps({"script": os.path.relpath(path, ROOT), "returncode": code,
                      "output": text}), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
