"""The authors' block-diffusion `generate` loops, restated in numpy for the decoding tests.

Each function follows one released algorithm step for step (which forwards run, which positions
commit, when a block or the whole decode ends) and drives it with a `logits_fn(x) -> [len(x), V]`
that forwards the canvas x (token ids from the first prompt token on, RoPE positions 0..) with
block-causal attention: a float64 reference model, so that nothing is shared with the decoder
under test but the weights. Sources read (no code copied):

* LLaDA2.0: `LLaDA2MoeModelLM.generate`, models/llada2_moe/modeling_llada2_moe.py of
  inclusionAI/dFactory at 92b6890808088b112fcf5fc73a341b78b6ab76bf (the same function as the
  LLaDA2.0 copy dllm vendors).
* LLaDA2.1: `LLaDA2MoeModelLM.generate` of the LLaDA2.1 remote code as dllm vendors it,
  dllm/pipelines/llada21/models/modeling_llada21_moe.py (lingjiechen2/dllm at
  7520f3c74b336479789d467bd577a78f580f5b10), and dllm's `LLaDA21Sampler`, which mirrors it.
* SDAR: `block_diffusion_generate` (remasking_strategy "low_confidence_dynamic"), generate.py
  of JetAstra/SDAR at c2041a8333333d685f6e15122c84f60f51f85ebd.

Greedy decoding everywhere: the candidate is the argmax and its confidence the softmax
probability (LLaDA2.1's `temperature == 0` branch; SDAR's sampler divides by the temperature and
has no greedy branch, and the dFactory copy of LLaDA2.0's samples at T = 1 when given 0: greedy
here is our decoders' `temperature = 0`). `steps = block_length` (the official default for
LLaDA2 and SDAR): one transfer at least per step.

Every function also returns the smallest decision margin it met (a masked or editable
position's confidence against its threshold, the gap between the best and second-best
candidate probability where a token is written, the gap between the two most confident masked
positions where only one commits): a float32 decoder can only agree token for token where those
margins exceed its rounding.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Generated(NamedTuple):
  tokens: np.ndarray    # the official output (LLaDA2: the response cut after its first EOS;
                        # SDAR: the whole canvas x, prompt included)
  forwards: int         # model forwards the official loop runs
  denoise: int          # of which denoising forwards (LLaDA2: all of them)
  blocks: int           # blocks decoded
  margin: float         # smallest decision margin met


def _greedy(logits):
  """(argmax [b], its softmax probability [b], top-1 minus top-2 probability [b])."""
  z = logits - logits.max(-1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  top2 = np.sort(p, axis=-1)[:, -2:]
  return p.argmax(-1), p.max(-1), top2[:, 1] - top2[:, 0]


class _Margin:
  def __init__(self):
    self.value = math.inf

  def update(self, *values):
    for v in values:
      v = np.asarray(v, np.float64)
      if v.size:
        self.value = min(self.value, float(np.min(np.abs(v))))


def _check_written(cand, written, mask_id):
  """The loops here assume a model that never proposes [MASK] (a committed [MASK] would stay
  masked: the official loops then leave a block unfinished where our decoders fill it)."""
  if np.any(cand[written] == mask_id):
    raise AssertionError("the reference model proposed the mask token: pick another seed")


def _masked_transfer(conf, active, threshold, margin: _Margin):
  """The official M2T choice: every active position with `conf > threshold`, else the single
  most confident (num_to_transfer = 1)."""
  transfer = active & (conf > threshold)
  margin.update(conf[active] - threshold)
  if not transfer.any() and active.any():
    masked_conf = np.where(active, conf, -np.inf)
    order = np.argsort(-masked_conf, kind="stable")
    if active.sum() > 1:
      margin.update(masked_conf[order[0]] - masked_conf[order[1]])
    transfer[order[0]] = True
  return transfer


def llada2_generate(logits_fn, prompt, *, gen_length, block_length, threshold, mask_id, eos_id,
                    version="2.0", editing_threshold=1.0, max_post_steps=0,
                    eos_early_stop=False) -> Generated:
  """The official LLaDA2.0 / 2.1 `generate` (greedy, steps = block_length, minimal_topk = 1,
  num_to_transfer = 1). Blocks sit at absolute positions: [k*b, (k+1)*b) from the first
  prompt token; the blocks holding only prompt tokens are never decoded, the prompt's last
  (partial) block is. 2.0 stops after the block whose generated part holds EOS; 2.1 does so
  only with `eos_early_stop`, and edits committed non-prompt tokens of the active block whose
  candidate differs with probability > `editing_threshold`, with up to `max_post_steps`
  forwards on the filled block (ending at the first that edits nothing)."""
  prompt = np.asarray(prompt)
  n, b = len(prompt), block_length
  num_blocks = (n + gen_length + b - 1) // b
  x = np.full(num_blocks * b, mask_id, np.int64)
  x[:n] = prompt
  forwards = blocks = 0
  margin = _Margin()
  for k in range(n // b, num_blocks):
    lo, end = k * b, (k + 1) * b
    in_prompt = np.arange(lo, end) < n
    blocks += 1
    if version == "2.0":
      for _ in range(b):
        active = x[lo:end] == mask_id
        if not active.any():
          break
        cand, conf, gap = _greedy(logits_fn(x[:end])[-b:])
        forwards += 1
        transfer = _masked_transfer(conf, active, threshold, margin)
        margin.update(gap[transfer])
        _check_written(cand, transfer, mask_id)
        x[lo:end][transfer] = cand[transfer]
      if (x[n:end] == eos_id).any():
        break
      continue
    post = 0
    while True:
      old = x[lo:end].copy()
      active = old == mask_id
      if not active.any():
        post += 1
      if post > max_post_steps:
        break
      cand, conf, gap = _greedy(logits_fn(x[:end])[-b:])
      forwards += 1
      transfer = _masked_transfer(conf, active, threshold, margin)
      editable = ~active & ~in_prompt
      if editing_threshold < 1.0:
        margin.update(conf[editable] - editing_threshold)
      edit = editable & (conf > editing_threshold) & (cand != old)
      margin.update(gap[transfer | (editable & (conf > editing_threshold))])
      _check_written(cand, transfer | edit, mask_id)
      x[lo:end][transfer | edit] = cand[transfer | edit]
      if not active.any() and not edit.any():
        break
    generated = x[n:end]
    if eos_early_stop and not (generated == mask_id).any() and (generated == eos_id).any():
      break
  response = x[n:n + gen_length]
  eos = np.flatnonzero(response == eos_id)
  cut = eos[0] + 1 if eos.size else gen_length
  return Generated(response[:cut], forwards, forwards, blocks, margin.value)


def sdar_generate(logits_fn, prompt, *, gen_length, block_length, threshold, mask_id,
                  stop_ids) -> Generated:
  """SDAR's `block_diffusion_generate`, low_confidence_dynamic, greedy, denoising_steps =
  block_length. The prompt's complete blocks are prefilled into the KV cache (one forward);
  each block from the prompt's last (partial) one on takes denoising forwards until no mask
  remains, then one more forward that stores its K/V (`store_kv=True`, every block, the last
  included). The loop ends after the block that leaves a stop id in the generated canvas.
  `logits_fn` recomputes the window instead of reading a cache: block-causal attention makes
  the two equal, and the forwards counted are the official loop's."""
  prompt = np.asarray(prompt)
  n, b = len(prompt), block_length
  num_blocks = (n + gen_length + b - 1) // b
  x = np.full(num_blocks * b, mask_id, np.int64)
  x[:n] = prompt
  forwards = denoise = blocks = 0
  margin = _Margin()
  if n // b > 0:
    forwards += 1                                   # the prefill
  for k in range(n // b, num_blocks):
    lo, end = k * b, (k + 1) * b
    blocks += 1
    for _ in range(b + 1):
      active = x[lo:end] == mask_id
      if not active.any():
        forwards += 1                               # store the block's K/V
        break
      cand, conf, gap = _greedy(logits_fn(x[:end])[-b:])
      forwards += 1
      denoise += 1
      transfer = _masked_transfer(conf, active, threshold, margin)
      margin.update(gap[transfer])
      _check_written(cand, transfer, mask_id)
      x[lo:end][transfer] = cand[transfer]
    if np.isin(x[n:], stop_ids).any():
      break
  return Generated(x, forwards, denoise, blocks, margin.value)


def block_causal_mask(length: int, block_length: int) -> np.ndarray:
  """[q, k] bool: key k visible to query q (same or earlier block of `block_length`)."""
  block = np.arange(length) // block_length
  return block[None, :] <= block[:, None]
