"""Exports other tools can use (docs/models.md#exports-and-other-tools): a Hugging Face directory
written by the project holds the tokenizer files transformers reads, declares the authors' own
classes (`auto_map`) for the model types transformers does not ship exactly as the released
config.json files do, and carries the source directory's modeling code; with that code present,
transformers resolves the class `auto_map` names and loads every exported tensor into it.

The authors' modeling files are not part of the project: a stand-in with the official module
tree of LLaDA-8B (parameter names and shapes, no forward) plays their role here."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from configs import llada
from orl_jax.models import families, hf_write
from orl_jax.setup.build import build_setup, initial_params
from orl_jax.storage.hf_export import export_hf_dir
from tests.support.hf import write_llada_hf_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The released config.json files' declarations (GSAI-ML/LLaDA-8B-Instruct,
# inclusionAI/LLaDA2.1-mini, JetLM/SDAR-*-Chat)
OFFICIAL = {
    "llada": (["LLaDAModelLM"], {"AutoConfig": "configuration_llada.LLaDAConfig",
                                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                                 "AutoModel": "modeling_llada.LLaDAModelLM"}),
    "llada2_moe": (["LLaDA2MoeModelLM"], {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"}),
    "sdar": (["SDARForCausalLM"], {"AutoConfig": "configuration_sdar.SDARConfig",
                                   "AutoModel": "modeling_sdar.SDARModel",
                                   "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}),
}

STAND_IN_CONFIG = '''
from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
  model_type = "llada"
'''

STAND_IN_MODEL = '''
import torch
from torch import nn
from transformers import PreTrainedModel

from .configuration_llada import LLaDAConfig


class Norm(nn.Module):
  def __init__(self, d):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(d))


class Block(nn.Module):
  def __init__(self, c):
    super().__init__()
    d, f, kv = c.d_model, c.mlp_hidden_size, c.d_model // c.n_heads * c.n_kv_heads
    lin = lambda i, o: nn.Linear(i, o, bias=False)
    self.attn_norm, self.ff_norm = Norm(d), Norm(d)
    self.q_proj, self.k_proj, self.v_proj = lin(d, d), lin(d, kv), lin(d, kv)
    self.attn_out = lin(d, d)
    self.ff_proj, self.up_proj, self.ff_out = lin(d, f), lin(d, f), lin(f, d)


class Transformer(nn.Module):
  def __init__(self, c):
    super().__init__()
    self.wte = nn.Embedding(c.embedding_size, c.d_model)
    self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
    self.ln_f = Norm(c.d_model)
    self.ff_out = nn.Linear(c.d_model, c.embedding_size, bias=False)


class Model(nn.Module):
  def __init__(self, c):
    super().__init__()
    self.transformer = Transformer(c)


class LLaDAModelLM(PreTrainedModel):
  config_class = LLaDAConfig
  base_model_prefix = "model"

  def __init__(self, config):
    super().__init__(config)
    self.model = Model(config)
    self.post_init()

  def _init_weights(self, module):
    pass
'''

# run in a fresh process: transformers reads HF_MODULES_CACHE when it is imported
LOAD = '''
import json, sys
import numpy as np
import transformers
from safetensors.numpy import load_file
path = sys.argv[1]
config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=True)
model, info = transformers.AutoModel.from_pretrained(path, trust_remote_code=True,
                                                     output_loading_info=True)
tensors = load_file(path + "/model.safetensors")
state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
tok = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)
print(json.dumps({
    "config_class": type(config).__name__, "model_class": type(model).__name__,
    "module": type(model).__module__,
    "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
    "mismatched": [str(m) for m in info["mismatched_keys"]],
    "equal": all(np.array_equal(state[k], v.astype(np.float32)) for k, v in tensors.items()),
    "special": {r: getattr(tok, r + "_token") for r in ("eos", "pad", "mask", "bos")},
    "ids": tok.encode("What is 7 * 8?", add_special_tokens=False),
    "chat_template": tok.chat_template}))
'''


@pytest.mark.parametrize("family,model_type", [("llada", "llada"),
                                               ("llada2_moe", "llada2_moe"), ("qwen3", "sdar")])
def test_config_json_declares_the_authors_classes_as_the_released_files_do(family, model_type):
  from orl_jax.models.moe import MoEConfig
  from orl_jax.models.transformer import ModelConfig
  moe = MoEConfig(n_experts=4, top_k=2, expert_dim=8) if family == "llada2_moe" else None
  cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1,
                    head_dim=8, mlp_dim=24, mask_id=60, qk_norm=False, moe=moe, hf_family=family)
  written = hf_write.hf_config_json(cfg, family, model_type=model_type)
  architectures, auto_map = OFFICIAL[model_type]
  assert (written["model_type"], written["architectures"], written["auto_map"]) == (
      model_type, architectures, auto_map)
  assert families.get(family).remote_code[model_type]["auto_map"] == auto_map
  # QwenDLM's model_type is transformers' own: no remote code declared
  if family == "qwen3":
    assert "auto_map" not in hf_write.hf_config_json(cfg, family)


def test_llada_export_loads_in_transformers_with_the_authors_code(tmp_path):
  """A LLaDA-8B directory holding (stand-ins for) the authors' modeling files and a
  tokenizer_config.json with a chat template: the project's export copies the code, declares
  `auto_map`, writes the run's special tokens for transformers' tokenizer, and
  `AutoModel.from_pretrained(..., trust_remote_code=True)` loads every tensor into the class."""
  source = str(tmp_path / "LLaDA-8B-Instruct")
  write_llada_hf_dir(source, d_model=16, n_layers=2, seed=0)
  for name, text in (("configuration_llada.py", STAND_IN_CONFIG),
                     ("modeling_llada.py", STAND_IN_MODEL)):
    with open(os.path.join(source, name), "w") as f:
      f.write(textwrap.dedent(text))
  with open(os.path.join(source, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
               "chat_template": "{{ messages[0]['content'] }}"}, f)
  config = llada.get_config("8b-instruct")
  config.model.path = source
  config.model.residual.mode = "none"
  config.model.dtype = config.model.param_dtype = "float32"
  s = build_setup(config, prompts=())
  _, params = initial_params(s)
  out = export_hf_dir(s, params, str(tmp_path / "export"))
  assert {"modeling_llada.py", "configuration_llada.py", "tokenizer.json",
          "tokenizer_config.json", "special_tokens_map.json"} <= set(os.listdir(out))
  env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HOME=str(tmp_path / "hf_home"))
  run = subprocess.run([sys.executable, "-c", LOAD, out], env=env, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert (got["config_class"], got["model_class"]) == ("LLaDAConfig", "LLaDAModelLM")
  assert got["module"].endswith("modeling_llada")
  assert got["missing"] == got["unexpected"] == got["mismatched"] == [] and got["equal"]
  # the run's special tokens (the 8b-instruct EOS <|eot_id|>, not the source's), its ids
  assert got["special"] == {"eos": "<|eot_id|>", "pad": "<|endoftext|>", "mask": "<|mdm_mask|>",
                            "bos": "<|startoftext|>"}
  assert got["ids"] == s.tokenizer.encode("What is 7 * 8?")
  assert got["chat_template"] == "{{ messages[0]['content'] }}"
