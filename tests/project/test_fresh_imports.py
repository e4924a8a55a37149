"""Every library module is importable as a program's first import (a fresh interpreter, nothing
imported before it): an import cycle that only works when another module happened to be
imported first fails here, naming the module."""
import concurrent.futures
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


def _import(module: str) -> tuple[str, int, str]:
  out = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  return module, out.returncode, out.stderr


@pytest.fixture(scope="module")
def imports():
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    return {m: (rc, err) for m, rc, err in pool.map(_import, MODULES)}


def test_the_packages_have_modules():
  assert len(MODULES) > 100 and "orl_jax.decode.build" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_the_module_is_importable_first(imports, module):
  rc, err = imports[module]
  assert rc == 0, f"`python -c 'import {module}'` failed:\n{err[-3000:]}"
