"""The committed tiny base model (assets/tiny_base, made by `make base`) loads and is accurate,
its provenance is recorded, and (slow) the recipe reproduces it."""
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import tiny
from orl_jax.apps import base_model
from orl_jax import evaluate as eval_lib
from orl_jax.models import params_io
from orl_jax.setup.build import build_setup, initial_params
from orl_jax.storage import machine as machine_lib
from orl_jax.unmasking import UnmaskRule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = os.path.join(ROOT, "assets", "tiny_base")


def test_committed_base_model_is_accurate():
  assert os.path.exists(os.path.join(BASE, "params.safetensors")), "run `make base`"
  meta = params_io.read_meta(BASE)
  config = tiny.get_config("eval")
  config.model.init_from = BASE
  s = build_setup(config)
  assert meta["vocab_hash"] == s.tokenizer.vocab_hash()
  graphdef, params = initial_params(s)
  problems = s.task.eval_problems()[:64]
  r = eval_lib.evaluate_setting(graphdef, params, problems, s.task, s.config,
                                UnmaskRule("fixed_steps", 1), batch_size=64)
  assert r["accuracy"] >= 0.85, r["accuracy"]
  assert r["nfe_mean_engine"] == 32  # one token per forward over a 32-token block
  assert r["nfe_mean"] == 33         # + the commit forward the paper counts per block
  assert r["nfe_mean_denoise"] == 32  # the authors' count: denoising forwards only
  assert r["tpf_pooled_denoise"] == r["tpf_pooled"] * 33 / 32


def test_base_model_provenance_is_recorded():
  with open(os.path.join(BASE, "README.md")) as f:
    text = f.read()
  assert "make base" in text and "seed" in text and "## What reproduces" in text
  measured = params_io.read_meta(BASE)["make_base"]["eval"]
  for label in base_model.SETTINGS:                     # the README states the recorded figures
    assert f"{measured[label]['accuracy']:.3f} with `{label}`" in text, label


def test_make_base_writes_its_files_and_leaves_the_rest(tmp_path):
  """`make base` replaces params, meta.json and README.md in place (never the whole folder)
  and records the machine; the README is regenerated from the recorded figures."""
  import shutil
  out = tmp_path / "tiny_base"
  out.mkdir()
  (out / "NOTES.txt").write_text("kept")
  (out / "README.md").write_text("old")
  record = dict(params_io.read_meta(BASE)["make_base"], train_minutes=17.5, eval_minutes=1.0,
                resumed_from_step=0,
                command="python launch/make_base.py --config=configs/tiny.py:sft")
  run_params = tmp_path / "work" / "params"
  shutil.copytree(BASE, run_params)
  base_model.write_base(str(out), str(run_params), record)
  assert (out / "NOTES.txt").read_text() == "kept"
  meta = params_io.read_meta(str(out))
  assert meta["machine"] == machine_lib.machine() and meta["machine"]["cores"] >= 1
  assert machine_lib.same_machine(meta["machine"], machine_lib.machine())
  text = (out / "README.md").read_text()
  assert "training took 17.5 min" in text and "0.961 with `fixed_steps_1`" in text
  assert meta["machine"]["cpu"] in text
  copied, trained = out / params_io.PARAMS_FILE, run_params / params_io.PARAMS_FILE
  assert copied.read_bytes() == trained.read_bytes()


@pytest.mark.slow
def test_make_base_reproduces_the_committed_base(tmp_path):
  """The full `make base` recipe into a temporary folder (4000 steps: 20 min or more on 2
  cores): bit-identical parameters when meta.json's machine record is this machine, and in any
  case the committed accuracy within 2 points at each reported decoder setting."""
  committed = params_io.read_meta(BASE)
  config = tiny.get_config("sft")
  config.workdir = str(tmp_path / "work")
  record = base_model.make_base(config, str(tmp_path / "base"), progress=False)
  if machine_lib.same_machine(committed.get("machine"), machine_lib.machine()):
    ours = load_file(os.path.join(BASE, params_io.PARAMS_FILE))
    theirs = load_file(os.path.join(tmp_path, "base", params_io.PARAMS_FILE))
    assert ours.keys() == theirs.keys()
    for k in ours:
      np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
  for label in base_model.SETTINGS:
    want = committed["make_base"]["eval"][label]["accuracy"]
    got = record["eval"][label]["accuracy"]
    assert abs(got - want) <= 0.02, (label, got, want)
