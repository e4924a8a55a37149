"""A random LLaDA checkpoint under the official tensor names, and our decoder's view of it.

Both sides of the Fast-dLLM comparison read the same directory: the peer through
`fast_dllm.LLaDA.from_dir`, ours the way a run does (`config.model.path`, `orl_jax.weights`,
the `llada` family's loader), so the comparison is on identical weights.
"""
from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from configs import llada as llada_configs
from orl_jax.data.hf_tokenizer import BYTE_SPECIALS
from orl_jax.train import loop

# The byte-level tokenizer (`model.tokenizer="byte"`) supplies the special ids; its 260 tokens
# fit in any vocabulary this module writes.
PAD_ID, MASK_ID, EOS_ID = (BYTE_SPECIALS.index(t) for t in ("<|pad|>", "<|mask|>", "<|eos|>"))


def write_random_llada(path: str, *, d_model: int, n_layers: int, n_heads: int, mlp_dim: int,
                       vocab_size: int, seed: int = 0, head_scale: float = 1.0) -> str:
  """Random weights in LLaDA's HF layout (torch [out, in] shapes, float32). head_scale
  multiplies the untied head: larger values give more confident predictions, hence more
  tokens per forward under a threshold rule. -> path."""
  rng = np.random.default_rng(seed)
  d, f, v = d_model, mlp_dim, vocab_size
  w = lambda fan_in, *s: (rng.standard_normal(s) / np.sqrt(fan_in)).astype(np.float32)
  norm = lambda: (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
  t = {"model.transformer.wte.weight": w(1, v, d), "model.transformer.ln_f.weight": norm(),
       "model.transformer.ff_out.weight": head_scale * w(d, v, d)}
  for i in range(n_layers):
    p = f"model.transformer.blocks.{i}."
    t.update({p + "attn_norm.weight": norm(), p + "ff_norm.weight": norm(),
              p + "q_proj.weight": w(d, d, d), p + "k_proj.weight": w(d, d, d),
              p + "v_proj.weight": w(d, d, d), p + "attn_out.weight": w(d, d, d),
              p + "ff_proj.weight": w(d, f, d), p + "up_proj.weight": w(d, f, d),
              p + "ff_out.weight": w(f, d, f)})
  os.makedirs(path, exist_ok=True)
  save_file(t, os.path.join(path, "model.safetensors"))
  config = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": d,
            "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_heads,
            "mlp_hidden_size": f, "vocab_size": v, "embedding_size": v, "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5, "weight_tying": False, "mask_token_id": MASK_ID,
            "layer_norm_type": "rms", "include_bias": False, "rope": True,
            "activation_type": "silu", "block_type": "llama"}
  with open(os.path.join(path, "config.json"), "w") as fh:
    json.dump(config, fh)
  return path


def our_config(path: str, residual: str = "none", **decode_overrides):
  """A run config that starts from the LLaDA directory `path` (float32, byte tokenizer)."""
  c = llada_configs.get_config("8b-base")
  c.model.path, c.model.tokenizer = path, "byte"
  c.task.name = "gsm8k"   # any task: prompts come from `random_prompts`; gsm8k reads no file here
  c.model.dtype = c.model.param_dtype = "float32"
  c.model.residual.mode = residual
  c.model.special_tokens.update(dict(mask="<|mask|>", eos="<|eos|>", pad="<|pad|>", bos=""))
  for k, v in decode_overrides.items():
    setattr(c.decode, k, v)
  return c


def load_ours(path: str, residual: str = "none", **decode_overrides):
  """(graphdef, params, setup) of the LLaDA directory, read as a run reads model.path."""
  s = loop.setup(our_config(path, residual, **decode_overrides))
  graphdef, params = loop.initial_params(s)
  return graphdef, params, s


def random_prompts(n_rows: int, length: int, min_len: int, vocab_size: int, seed: int = 0):
  """Left-padded prompts: (ids [n, length] int32, valid [n, length] bool); row lengths cycle
  through min_len..length, ids avoid the special tokens."""
  rng = np.random.default_rng(seed)
  lens = min_len + np.arange(n_rows) % (length - min_len + 1)
  ids = rng.integers(len(BYTE_SPECIALS), vocab_size, (n_rows, length)).astype(np.int32)
  valid = np.arange(length)[None, :] >= (length - lens)[:, None]
  return np.where(valid, ids, PAD_ID).astype(np.int32), valid
