"""The real-family configs: each `:debug` variant runs 2 ORL iterations of a tiny random model
of its family on CPU through the launcher (the CI smoke test of configs/{llada,sdar,qwendlm}.py),
and the full-size variants validate and describe the DESIGN §4 shapes."""
import json
import os
import subprocess
import sys

import pytest

from configs import llada, qwendlm, sdar
from orl_jax.config import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# llada (the default config's family, an MoE) is the smoke path of the default run; the other
# two families' launcher runs are end-to-end repeats kept behind `slow` (their models, replay and
# lowered steps are covered by test_hf_models, test_train and test_lowering in the default run).
@pytest.mark.parametrize("name", ["llada", pytest.param("sdar", marks=pytest.mark.slow),
                                  pytest.param("qwendlm", marks=pytest.mark.slow)])
def test_debug_config_runs_two_orl_iterations(tmp_path, name):
  out = subprocess.run(
      [sys.executable, "launch/train.py", f"--config=configs/{name}.py:debug",
       f"--config.workdir={tmp_path}"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["policy_lag"] == 0 and r["states_packed"] > 0 for r in rows)
  assert os.path.isfile(tmp_path / "params" / "params.safetensors")
  # runs of a registered family also write WORKDIR/hf with the family's official names
  from safetensors import safe_open
  with open(tmp_path / "hf" / "config.json") as f:
    model_type = json.load(f)["model_type"]
  with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
    names = set(f.keys())
  if name == "llada":   # the debug variant is a tiny LLaDA2 MoE (layer 0 dense)
    assert model_type == "llada2_moe"
    assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.expert_bias",
            "model.layers.3.mlp.experts.7.down_proj.weight",
            "model.layers.2.attention.query_key_value.weight", "lm_head.weight"} <= names
  else:
    assert model_type == "qwen3" and "model.layers.1.self_attn.q_norm.weight" in names
  # ... and the trained model exports as a Hugging Face directory (round trip: test_hf_models)
  out = subprocess.run(
      [sys.executable, "launch/export.py", f"--config=configs/{name}.py:debug",
       f"--params={tmp_path / 'params'}", f"--out={tmp_path / 'hf'}"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert {"config.json", "model.safetensors", "adapter.safetensors"} <= set(
      os.listdir(tmp_path / "hf"))


@pytest.mark.parametrize("module,arg,attention,tied", [
    (llada, "8b-instruct", "bidirectional", False), (llada, "8b-base", "bidirectional", False),
    (sdar, "4b", "block_causal", False), (sdar, "8b", "block_causal", False),
    (qwendlm, "4b", "block_causal", True)])
def test_full_size_variants_validate(module, arg, attention, tied):
  c = module.get_config(arg)
  validate(c)
  assert c.model.attention == attention and c.model.tie_embeddings == tied
  assert c.model.path == "" and c.loss.vocab_chunk > 0
  assert c.model.special_tokens.mask == ""      # the model directory's mask_token_id
  if module is sdar:
    assert c.decode.block_size == 4
  if module is llada:
    assert c.model.vocab_size == 126464
