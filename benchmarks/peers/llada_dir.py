"""A random LLaDA checkpoint under the official tensor names, and our decoder's view of it.

Both sides of the Fast-dLLM comparison read the same directory: the peer through
`fast_dllm.LLaDA.from_dir`, ours the way a run does (`config.model.path`, `orl_jax.storage.weights`,
the `llada` family's loader), so the comparison is on identical weights.
"""
from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from configs import llada as llada_configs
from orl_jax.data.hf_tokenizer import BYTE_SPECIALS
from orl_jax.setup.build import build_setup, initial_params

# The byte-level tokenizer (`model.tokenizer="byte"`) supplies the special ids; its 260 tokens
# fit in any vocabulary this module writes.
PAD_ID, MASK_ID, EOS_ID = (BYTE_SPECIALS.index(t) for t in ("<|pad|>", "<|mask|>", "<|eos|>"))


def llada_tensors(n_layers: int, *, embedding, matrix, norm) -> dict:
  """LLaDA's checkpoint tensors under the official names, torch [out, in] shapes,
  drawn in one fixed order: `embedding()` the [V, D] table, `matrix(name)` each projection
  (name: wte-less suffix such as "q_proj", "ff_out" or "head"), `norm()` each RMSNorm scale."""
  t = {"model.transformer.wte.weight": embedding(), "model.transformer.ln_f.weight": norm(),
       "model.transformer.ff_out.weight": matrix("head")}
  for i in range(n_layers):
    p = f"model.transformer.blocks.{i}."
    t[p + "attn_norm.weight"], t[p + "ff_norm.weight"] = norm(), norm()
    for name in ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"):
      t[p + name + ".weight"] = matrix(name)
  return t


def llada_shape(name: str, *, d: int, f: int, v: int, hd: int | None = None) -> tuple:
  """The [out, in] shape of `llada_tensors`' matrix `name` (hd: query/key/value width)."""
  hd = hd or d
  return {"head": (v, d), "q_proj": (hd, d), "k_proj": (hd, d), "v_proj": (hd, d),
          "attn_out": (d, hd), "ff_proj": (f, d), "up_proj": (f, d), "ff_out": (d, f)}[name]


def write_random_llada(path: str, *, d_model: int, n_layers: int, n_heads: int, mlp_dim: int,
                       vocab_size: int, seed: int = 0, head_scale: float = 1.0) -> str:
  """Random weights in LLaDA's HF layout (torch [out, in] shapes, float32). head_scale
  multiplies the untied head: larger values give more confident predictions, hence more
  tokens per forward under a threshold rule. -> path."""
  rng = np.random.default_rng(seed)
  d, f, v = d_model, mlp_dim, vocab_size
  w = lambda fan_in, *s: (rng.standard_normal(s) / np.sqrt(fan_in)).astype(np.float32)

  def matrix(name):
    out_dim, in_dim = llada_shape(name, d=d, f=f, v=v)
    return (head_scale if name == "head" else 1.0) * w(in_dim, out_dim, in_dim)

  t = llada_tensors(n_layers, embedding=lambda: w(1, v, d), matrix=matrix,
                    norm=lambda: (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
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
  c.eval.n_problems = 1   # set-up checks the prompt lengths of the problems scored: just one
  c.model.dtype = c.model.param_dtype = "float32"
  c.model.residual.mode = residual
  c.model.special_tokens.update(dict(mask="<|mask|>", eos="<|eos|>", pad="<|pad|>", bos=""))
  for k, v in decode_overrides.items():
    setattr(c.decode, k, v)
  return c


def load_ours(path: str, residual: str = "none", **decode_overrides):
  """(graphdef, params, setup) of the LLaDA directory, read as a run reads model.path."""
  s = build_setup(our_config(path, residual, **decode_overrides))
  graphdef, params = initial_params(s)
  return graphdef, params, s


def random_prompts(n_rows: int, length: int, min_len: int, vocab_size: int, seed: int = 0):
  """Left-padded prompts: (ids [n, length] int32, valid [n, length] bool); row lengths cycle
  through min_len..length, ids avoid the special tokens."""
  rng = np.random.default_rng(seed)
  lens = min_len + np.arange(n_rows) % (length - min_len + 1)
  ids = rng.integers(len(BYTE_SPECIALS), vocab_size, (n_rows, length)).astype(np.int32)
  valid = np.arange(length)[None, :] >= (length - lens)[:, None]
  return np.where(valid, ids, PAD_ID).astype(np.int32), valid
