"""Every library module is importable as a program's first import (nothing of the project
imported before it): an import cycle that only works when another module happened to be
imported first fails here, naming the module. tests/scripts/import_each_first.py imports each in
a child forked from a process that holds only the third-party modules (JAX's import paid once,
not once per module)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules() -> list[str]:
  out = []
  for package in ("orl_jax", "orl_sandbox", "pallas_kernels"):
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.relpath(os.path.join(folder, name), ROOT)[:-3]
          out.append(path.replace(os.sep, ".").removesuffix(".__init__"))
  return sorted(out)


MODULES = _modules()


@pytest.fixture(scope="module")
def imports():
  """{module: "ok" or "failed: <traceback>"} for every module of MODULES."""
  out = subprocess.run([sys.executable, "tests/scripts/import_each_first.py", *MODULES],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  results = dict(line.split(" ", 1) for line in out.stdout.splitlines())
  assert sorted(results) == MODULES, out.stderr[-3000:]
  return results


def test_the_packages_have_modules():
  assert len(MODULES) > 100 and "orl_jax.decode.build" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_the_module_is_importable_first(imports, module):
  outcome = imports[module]
  assert outcome == "ok", (f"`import {module}` as the project's first import failed:\n"
                           + outcome.encode().decode("unicode_escape")[-3000:])
