"""Executes the Colab notebook on CPU in its reduced mode so it cannot rot."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_notebook_runs_in_reduced_mode(tmp_path, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  if not os.path.exists(os.path.join(ROOT, "assets", "tiny_base", "params.safetensors")):
    pytest.skip("no committed base model (make base)")
  monkeypatch.setenv("ORL_NOTEBOOK_REDUCED", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(os.path.join(ROOT, "notebooks", "orl_tpu_demo.ipynb"), as_version=4)
  # run from a copy of the workdir root so the test leaves nothing in the repository
  for cell in nb.cells:
    if cell.cell_type == "code":
      cell.source = cell.source.replace('"work_dirs/notebook_demo"', repr(str(tmp_path / "nb")))
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}})
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  html = [o for o in outputs if "text/html" in o.get("data", {})]
  assert html and "forwards:" in html[-1]["data"]["text/html"]
  assert os.path.exists(tmp_path / "nb" / "results.json")
