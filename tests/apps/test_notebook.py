"""Executes the Colab notebook on CPU in its reduced mode so it cannot rot, and checks what a
Colab user meets: the TPU runtime it asks for, every setting in the first cell, the clone cell
on a fresh runtime, text progress bars (no widgets) and every output under WORKDIR."""
import ast
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "orl_tpu_demo.ipynb")


def _cells():
  with open(NOTEBOOK) as f:
    return [(c["cell_type"], "".join(c["source"])) for c in json.load(f)["cells"]]


# Runs the settings cell and the clone cell as a fresh Colab runtime would (outside a checkout),
# with every `pip install` refused: the clone must import what the notebook imports as it is.
_CLONE_RUN = """
import json, os, subprocess, sys
calls = []
real_run = subprocess.run
def run(args, *a, **kw):
  calls.append(list(args))
  if "pip" in args:
    raise RuntimeError("the clone cell installed: " + " ".join(map(str, args)))
  return real_run(args, *a, **kw)
subprocess.run = run
settings, clone = json.loads(sys.argv[1])
namespace = {}
try:
  exec(settings, namespace)
  exec(clone, namespace)
except SystemExit as e:
  print(json.dumps({"exit": str(e), "calls": calls}))
else:
  print(json.dumps({"cwd": os.getcwd(), "calls": calls}))
"""


def _code_cells():
  return [text for kind, text in _cells() if kind == "code"]


def _run_clone_cell(workdir, repo_url: str) -> dict:
  settings, clone = _code_cells()[:2]
  settings = settings.replace('REPO_URL = ""', f"REPO_URL = {repo_url!r}")
  out = subprocess.run([sys.executable, "-c", _CLONE_RUN, json.dumps([settings, clone])],
                       cwd=workdir, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_notebook_asks_colab_for_a_tpu_and_every_setting_is_in_its_first_cell():
  """Colab reads the runtime from the metadata; REPO_URL, REDUCED, WORKDIR and CHECK_TPU_FIT
  are assigned in the first code cell and in no other (a user edits one cell)."""
  with open(NOTEBOOK) as f:
    assert json.load(f)["metadata"].get("accelerator") == "TPU"
  cells = _code_cells()
  settings = {"REPO_URL", "REDUCED", "WORKDIR", "CHECK_TPU_FIT"}
  namespace: dict = {}
  exec(cells[0], namespace)
  assert isinstance(namespace["REPO_URL"], str) and isinstance(namespace["WORKDIR"], str)
  assert isinstance(namespace["REDUCED"], bool) and isinstance(namespace["CHECK_TPU_FIT"], bool)
  for i, text in enumerate(cells[1:], 1):
    assigned = {t.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    assert not assigned & settings, (i, assigned & settings)
  with open(os.path.join(ROOT, "README.md")) as f:
    linked = re.findall(r"\]\(([^)]*orl_tpu_demo\.ipynb)\)", f.read())
  assert linked and all(os.path.exists(os.path.join(ROOT, p)) for p in linked), linked


def test_clone_cell_clones_the_repository_and_imports_without_installing(tmp_path):
  """On a fresh runtime (no checkout) the clone cell clones REPO_URL and ends in the clone,
  whose imports work as they are here (no pip install); without REPO_URL it stops and says
  what to set."""
  if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode:
    pytest.skip("not a git checkout")
  empty = _run_clone_cell(tmp_path, "")
  assert "Set REPO_URL" in empty["exit"] and empty["calls"] == []
  got = _run_clone_cell(tmp_path, "file://" + ROOT)
  assert got["cwd"] == str(tmp_path / "orl_jax_repo")
  assert got["calls"][0][:3] == ["git", "clone", "--depth=1"] and len(got["calls"]) == 2
  assert os.path.exists(tmp_path / "orl_jax_repo" / "notebooks" / "orl_tpu_demo.ipynb")


def test_notebook_runs_in_reduced_mode(tmp_path, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  if not os.path.exists(os.path.join(ROOT, "assets", "tiny_base", "params.safetensors")):
    pytest.skip("no committed base model (make base)")
  monkeypatch.setenv("ORL_NOTEBOOK_REDUCED", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  # WORKDIR set to a temporary folder, as a user edits the settings cell
  work = tmp_path / "nb"
  for cell in nb.cells:
    if cell.cell_type == "code":
      cell.source = cell.source.replace('WORKDIR = "work_dirs/notebook_demo"',
                                        f"WORKDIR = {str(work)!r}")
  resources = {"metadata": {"path": os.path.join(ROOT, "notebooks")}}
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources=resources)
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json"
              in o.get("data", {})], "progress must be text, not widgets"
  text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
  assert "REDUCED=True" in text
  assert re.search(r"\d+/\d+ \[\d+:\d+<", text), "a text bar: done/total [elapsed<left"
  html = [o for o in outputs if "text/html" in o.get("data", {})]
  page = html[-1]["data"]["text/html"] if html else ""
  assert "class='legend'" in page and "(paper's count)" in page and "<b>orl</b>" in page
  for name in ("results.json", "accuracy_vs_tpf.png", "curves_orl.png"):
    assert os.path.exists(work / name), name
