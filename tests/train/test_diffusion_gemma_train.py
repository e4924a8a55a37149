"""The train bar of DiffusionGemma: `configs/diffusion_gemma.py:debug` runs ORL for two
iterations on CPU (rollout with the uniform-noise sampler and capture -> pack -> exact replay ->
update) and exports WORKDIR/hf, which transformers loads with the trained weights."""
import json
import os

import numpy as np
import pytest

from configs import diffusion_gemma as dg_configs
from orl_jax.metrics import read_jsonl
from tests.support import diffusion_gemma_dirs as dg_hf
from orl_jax.train.entry import train


@pytest.mark.slow
def test_debug_config_trains_two_orl_iterations_and_exports_for_transformers(tmp_path):
  c = dg_configs.get_config("debug")
  c.workdir = str(tmp_path / "run")
  c.train.steps = 2
  train(c, progress=False)
  rows = read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2]
  last = rows[-1]
  assert last["updates"] == 2 and np.isfinite(last["loss"]) and last["loss_ce"] > 0
  # the KL anchor's gate is open (its value stays 0 in exact arithmetic here: the first
  # update has learning rate 0 under warmup, so the params still equal the reference)
  assert last["responses_kl"] > 0
  assert last["rollout_uses"] == 1 and last["states_dropped"] == 0
  # TPF both ways: the paper's count has one commit forward per canvas on top of the decoder's
  assert last["rollout_tpf_denoise"] > last["rollout_tpf"] > 0
  hf_dir = os.path.join(c.workdir, "hf")
  with open(os.path.join(hf_dir, "config.json")) as f:
    assert json.load(f)["model_type"] == "diffusion_gemma"
  model, _ = dg_hf.load_dir(hf_dir)
  exported = dg_hf.flat_params(model)
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  tm = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(hf_dir).eval()
  state = tm.state_dict()
  for name, value in dg_hf.params_to_hf(exported, model.cfg).items():
    np.testing.assert_array_equal(state[name].numpy(), value, err_msg=name)
  prompt = torch.tensor(np.arange(3, 35).reshape(1, 32) % model.cfg.vocab_size)
  canvas = torch.tensor(np.arange(5, 21).reshape(1, 16) % model.cfg.vocab_size)
  with torch.no_grad():
    assert np.isfinite(tm(input_ids=prompt, decoder_input_ids=canvas).logits.numpy()).all()
