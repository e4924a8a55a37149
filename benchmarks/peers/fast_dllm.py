"""Fast-dLLM's LLaDA decoders in PyTorch: the peer that benchmarks/decode_throughput.py measures.

Source: NVlabs/Fast-dLLM (Apache License 2.0, Copyright 2025 NVIDIA CORPORATION & AFFILIATES),
`llada/generate.py` (`generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`,
`get_transfer_index`, `get_num_transfer_tokens`, `add_gumbel_noise`) and the parts of
`llada/model/modeling_llada.py` those call: LLaDA's LLaMA block (RMSNorm, q/k/v, half-split
RoPE applied to the *unrotated* cached keys at every forward, SDPA without a causal mask,
SwiGLU `ff_proj`/`up_proj`/`ff_out`), `past_key_values` appended to (prefix cache) or
overwritten in place at `replace_position` (dual cache), logits for every query position.
Re-written here (nothing is downloaded at run time); the decoders keep the originals' control
flow, float64 confidence, per-row `topk` loop and batch-level NFE count.

One addition: `key_valid` ([B, L] bool, optional), an attention bias that hides the left
padding of a batch of prompts of different lengths from every query. Fast-dLLM's decoders pass
no mask (their batches are unpadded); with `key_valid=None` the forward is theirs. LLaDA's
modeling file accepts such an `attention_mask`; the benchmark needs it so that both decoders
see the same padded canvas.

torch is a benchmark/test-only dependency: the library never imports this module.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file


@dataclasses.dataclass(frozen=True)
class LLaDAConfig:
  """The fields of a LLaDA `config.json` (model_type "llada") the forward uses."""
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  mlp_hidden_size: int
  vocab_size: int
  rope_theta: float
  rms_norm_eps: float
  weight_tying: bool

  @classmethod
  def from_dir(cls, path: str) -> "LLaDAConfig":
    with open(os.path.join(path, "config.json")) as f:
      hf = json.load(f)
    return cls(d_model=hf["d_model"], n_layers=hf["n_layers"], n_heads=hf["n_heads"],
               n_kv_heads=hf.get("n_kv_heads") or hf["n_heads"],
               mlp_hidden_size=hf["mlp_hidden_size"],
               vocab_size=hf.get("embedding_size") or hf["vocab_size"],
               rope_theta=float(hf.get("rope_theta", 10000.0)),
               rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
               weight_tying=bool(hf.get("weight_tying", False)))


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
  """Every `*.safetensors` file of an HF directory (sharded or not), as float32."""
  tensors = {}
  for name in sorted(os.listdir(path)):
    if name.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(path, name)))
  return {k: v.float() for k, v in tensors.items()}


class LLaDA(torch.nn.Module):
  """LLaDA-8B's architecture (modeling_llada.py, `LLaDALlamaBlock`), official tensor names."""

  def __init__(self, cfg: LLaDAConfig, tensors: dict[str, torch.Tensor]):
    super().__init__()
    self.cfg = cfg
    self.w = {k.removeprefix("model.transformer."): v for k, v in tensors.items()}
    self.head = self.w["wte.weight"] if cfg.weight_tying else self.w["ff_out.weight"]
    self.head_dim = cfg.d_model // cfg.n_heads
    self._rope_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

  @classmethod
  def from_dir(cls, path: str) -> "LLaDA":
    return cls(LLaDAConfig.from_dir(path), _read_tensors(path)).eval()

  def _rms(self, x, weight):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
    return weight * x32.to(x.dtype)

  def _sin_cos(self, length: int):
    """RotaryEmbedding.get_rotary_embedding: [1, 1, length, head_dim] each."""
    if length not in self._rope_cache:
      dim = self.head_dim
      inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
      freqs = torch.einsum("i,j->ij", torch.arange(length, dtype=torch.float), inv_freq)
      pos = torch.cat((freqs, freqs), dim=-1)[None, None]
      self._rope_cache[length] = (pos.sin(), pos.cos())
    return self._rope_cache[length]

  @staticmethod
  def _rotate(t, sin, cos):
    b, h, n, d = t.shape
    x1, x2 = t.view(b, h, n, 2, d // 2).unbind(dim=-2)
    return t * cos + torch.cat((-x2, x1), dim=-1) * sin

  def _attention(self, q, k, v, layer_past, replace_position, key_valid):
    """q, k, v: [B, H, T, dh] (k, v not rotated). -> (out [B, T, H*dh], (k, v) to cache)."""
    query_len = q.shape[-2]
    q_end = None
    if layer_past is not None:
      past_k, past_v = layer_past
      if replace_position is None:   # prefix cache: append
        k, v = torch.cat((past_k, k), dim=-2), torch.cat((past_v, v), dim=-2)
      else:                          # dual cache: overwrite the block in place, row by row
        for row in range(replace_position.shape[0]):
          idx = replace_position[row].nonzero(as_tuple=True)[0]
          past_k[row, :, idx], past_v[row, :, idx] = k[row, :, :len(idx)], v[row, :, :len(idx)]
        k, v = past_k, past_v
        q_end = int(replace_position[0].nonzero(as_tuple=True)[0].max()) + 1
    present = (k, v)
    key_len = k.shape[-2]
    q_end = key_len if q_end is None else q_end
    sin, cos = self._sin_cos(key_len)
    q = self._rotate(q, sin[:, :, q_end - query_len:q_end], cos[:, :, q_end - query_len:q_end])
    k = self._rotate(k, sin, cos)
    if self.cfg.n_kv_heads != self.cfg.n_heads:
      rep = self.cfg.n_heads // self.cfg.n_kv_heads
      k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    bias = None
    if key_valid is not None:
      bias = torch.zeros(key_valid.shape[0], 1, 1, key_len, dtype=q.dtype)
      bias.masked_fill_(~key_valid[:, None, None, :key_len], float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=False)
    b, h, t, d = out.shape
    return out.transpose(1, 2).reshape(b, t, h * d), present

  def _block(self, i, x, layer_past, replace_position, key_valid):
    w = lambda name: self.w[f"blocks.{i}.{name}.weight"]
    b, t, _ = x.shape
    heads = lambda y, n: y.view(b, t, n, self.head_dim).transpose(1, 2)
    h = self._rms(x, w("attn_norm"))
    q = heads(F.linear(h, w("q_proj")), self.cfg.n_heads)
    k = heads(F.linear(h, w("k_proj")), self.cfg.n_kv_heads)
    v = heads(F.linear(h, w("v_proj")), self.cfg.n_kv_heads)
    att, present = self._attention(q, k, v, layer_past, replace_position, key_valid)
    x = x + F.linear(att, w("attn_out"))
    h = self._rms(x, w("ff_norm"))
    h = F.silu(F.linear(h, w("ff_proj"))) * F.linear(h, w("up_proj"))
    return x + F.linear(h, w("ff_out")), present

  def forward(self, input_ids, past_key_values=None, use_cache=False, replace_position=None,
              key_valid=None):
    """-> (logits [B, T, V] f32, past_key_values or None). key_valid: [B, L] over the whole
    canvas the keys come from (see the module docstring)."""
    x = F.embedding(input_ids, self.w["wte.weight"])
    presents = []
    for i in range(self.cfg.n_layers):
      layer_past = None if past_key_values is None else past_key_values[i]
      x, present = self._block(i, x, layer_past, replace_position, key_valid)
      presents.append(present)
    logits = F.linear(self._rms(x, self.w["ln_f.weight"]), self.head)
    return logits, (presents if use_cache else None)


# --------------------------------------------------------------------- generate.py, ported


def add_gumbel_noise(logits, temperature: float):
  """Gumbel-max in float64 (low precision hurts masked-diffusion sampling)."""
  if temperature == 0:
    return logits
  logits = logits.to(torch.float64)
  noise = torch.rand_like(logits, dtype=torch.float64)
  return logits.exp() / (-torch.log(noise)) ** temperature


def get_num_transfer_tokens(block_mask_index, steps: int):
  """Tokens to unmask per step of a block (linear schedule; used when threshold is None)."""
  mask_num = block_mask_index.sum(dim=1, keepdim=True)
  base, remainder = mask_num // steps, mask_num % steps
  out = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
  for i in range(mask_num.size(0)):
    out[i, :remainder[i]] += 1
  return out


def get_transfer_index(logits, temperature, mask_index, x, num_transfer_tokens, threshold=None):
  """(x0, transfer_index): low-confidence remasking; with `threshold`, every masked position
  whose float64 softmax confidence reaches it, and always the most confident one."""
  x0 = torch.argmax(add_gumbel_noise(logits, temperature), dim=-1)
  p = F.softmax(logits.to(torch.float64), dim=-1)
  x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
  x0 = torch.where(mask_index, x0, x)
  confidence = torch.where(mask_index, x0_p, -np.inf)
  transfer_index = torch.zeros_like(x0, dtype=torch.bool)
  if threshold is not None:
    num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
  for j in range(confidence.shape[0]):
    _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
    transfer_index[j, select_index] = True
    if threshold is not None:
      for k in range(1, int(num_transfer_tokens[j])):
        if confidence[j, select_index[k]] < threshold:
          transfer_index[j, select_index[k]] = False
  return x0, transfer_index


def _canvas(prompt, gen_length, mask_id, prompt_valid):
  """(x [B, P + N]: the prompt then masks, key_valid [B, P + N] or None)."""
  x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
  x[:, :prompt.shape[1]] = prompt
  if prompt_valid is None:
    return x, None
  return x, torch.cat([prompt_valid, torch.ones_like(x[:, prompt.shape[1]:], dtype=torch.bool)], 1)


def _n(num_transfer, i, threshold):
  """The step's num_transfer_tokens column (None: the threshold decides)."""
  return None if threshold is not None else num_transfer[:, i]


@torch.inference_mode()
def generate(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.0,
             mask_id=126336, threshold=None, prompt_valid=None):
  """Plain LLaDA decoding: every step forwards the whole canvas. -> (x [B, P + N], nfe)."""
  x, key_valid = _canvas(prompt, gen_length, mask_id, prompt_valid)
  assert gen_length % block_length == 0
  num_blocks = gen_length // block_length
  steps_per_block = steps // num_blocks
  nfe = 0
  for num_block in range(num_blocks):
    start = prompt.shape[1] + num_block * block_length
    end = start + block_length
    num_transfer = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)
    i = 0
    while True:
      nfe += 1
      mask_index = x == mask_id
      logits, _ = model(x, key_valid=key_valid)
      mask_index[:, end:] = 0
      x0, transfer = get_transfer_index(logits, temperature, mask_index, x,
                                        _n(num_transfer, i, threshold), threshold)
      x[transfer] = x0[transfer]
      i += 1
      if (x[:, start:end] == mask_id).sum() == 0:
        break
  return x, nfe


def _first_step_with_cache(model, x, start, end, temperature, mask_id, threshold, num_transfer,
                           key_valid):
  """The first step of a block: a whole-canvas forward that (re)builds the KV cache."""
  logits, past_key_values = model(x, use_cache=True, key_valid=key_valid)
  mask_index = x == mask_id
  mask_index[:, end:] = 0
  x0, transfer = get_transfer_index(logits, temperature, mask_index, x,
                                    _n(num_transfer, 0, threshold), threshold)
  x[transfer] = x0[transfer]
  return past_key_values


@torch.inference_mode()
def generate_with_prefix_cache(model, prompt, steps=128, gen_length=128, block_length=128,
                               temperature=0.0, mask_id=126336, threshold=None, prompt_valid=None):
  """Prefix cache: per block one whole-canvas forward, then the canvas from the block on
  against the cached prefix keys. -> (x, nfe)."""
  x, key_valid = _canvas(prompt, gen_length, mask_id, prompt_valid)
  num_blocks = gen_length // block_length
  steps_per_block = steps // num_blocks
  nfe = 0
  for num_block in range(num_blocks):
    start = prompt.shape[1] + num_block * block_length
    end = start + block_length
    num_transfer = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)
    past = _first_step_with_cache(model, x, start, end, temperature, mask_id, threshold,
                                  num_transfer, key_valid)
    past = [(k[:, :, :start], v[:, :, :start]) for k, v in past]   # keep only the prefix
    nfe += 1
    i = 1
    while (x[:, start:end] == mask_id).sum() > 0:
      nfe += 1
      mask_index = x[:, start:] == mask_id
      mask_index[:, block_length:] = 0
      logits, _ = model(x[:, start:], past_key_values=past, use_cache=True, key_valid=key_valid)
      x0, transfer = get_transfer_index(logits, temperature, mask_index, x[:, start:],
                                        _n(num_transfer, i, threshold), threshold)
      x[:, start:][transfer] = x0[transfer]
      i += 1
  return x, nfe


@torch.inference_mode()
def generate_with_dual_cache(model, prompt, steps=128, gen_length=128, block_length=128,
                             temperature=0.0, mask_id=126336, threshold=None, prompt_valid=None):
  """Dual cache: per block one whole-canvas forward caches prefix and suffix keys, then each
  step forwards the block alone and overwrites its keys in the cache. -> (x, nfe)."""
  x, key_valid = _canvas(prompt, gen_length, mask_id, prompt_valid)
  num_blocks = gen_length // block_length
  steps_per_block = steps // num_blocks
  nfe = 0
  for num_block in range(num_blocks):
    start = prompt.shape[1] + num_block * block_length
    end = start + block_length
    num_transfer = get_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)
    past = _first_step_with_cache(model, x, start, end, temperature, mask_id, threshold,
                                  num_transfer, key_valid)
    nfe += 1
    i = 1
    replace_position = torch.zeros_like(x, dtype=torch.bool)
    replace_position[:, start:end] = 1
    while (x[:, start:end] == mask_id).sum() > 0:
      nfe += 1
      mask_index = x[:, start:end] == mask_id
      logits, _ = model(x[:, start:end], past_key_values=past, use_cache=True,
                        replace_position=replace_position, key_valid=key_valid)
      x0, transfer = get_transfer_index(logits, temperature, mask_index, x[:, start:end],
                                        _n(num_transfer, i, threshold), threshold)
      x[:, start:end][transfer] = x0[transfer]
      i += 1
  return x, nfe


DECODERS = {"plain": generate, "prefix": generate_with_prefix_cache,
            "dual": generate_with_dual_cache}
