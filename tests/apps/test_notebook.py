"""Executes the Colab notebook on CPU in its reduced mode so it cannot rot, and checks what a
Colab user meets: the settings cell (repository URL, REDUCED, WORKDIR) first, the clone cell,
the runtime choice explained, text progress bars (no widgets) and every output under WORKDIR."""
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "orl_tpu_demo.ipynb")


def _cells():
  with open(NOTEBOOK) as f:
    return [(c["cell_type"], "".join(c["source"])) for c in json.load(f)["cells"]]


def test_notebook_says_how_to_open_it_in_colab_and_sets_everything_in_its_first_cell():
  cells = _cells()
  intro = cells[0][1]
  assert "Runtime → Change runtime type → TPU" in intro and "REPO_URL" in intro
  first_code = next(text for kind, text in cells if kind == "code")
  for setting in ("REPO_URL = ", "REDUCED = ", "WORKDIR = "):
    assert setting in first_code, setting
  clone = [text for kind, text in cells if kind == "code" and "git\", \"clone\"" in text]
  assert clone and "REPO_URL" in clone[0] and "pip\", \"install\"" in clone[0]
  with open(os.path.join(ROOT, "README.md")) as f:
    assert "notebooks/orl_tpu_demo.ipynb" in f.read()


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
