"""Where blocks sit on the canvas (docs/decoding.md#decoding-as-each-models-authors-do), and the
response read back off them.

Where blocks sit follows each family's authors (`block_placement`, `place_prompts`):
"prompt_end" starts the first block at the prompt's end (Fast-dLLM's LLaDA-8B; our tiny
model); "absolute" puts block boundaries at multiples of b counted from the first prompt token
(LLaDA2.x, SDAR), so a prompt of n tokens shares its last block with the first b - n mod b
generated tokens: those prompt tokens sit in the first decoded block (bidirectional with its
masks, never rewritten), the KV prefill covers the prompt's complete blocks only, and a row
decodes ceil((n mod b + N) / b) blocks, its response cut to N tokens. Prompts arrive
left-padded to P (a block multiple); each row is shifted right by its `lead` = n mod b so its
blocks align with the canvas's (the response of row r starts at canvas index P + lead[r]).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from orl_jax.decode.config import DecodeConfig


class Placed(NamedTuple):
  """Left-padded prompts placed on the block grid (`place_prompts`, module docstring)."""
  tokens: jax.Array   # [B, P] the prompt's complete blocks, left-padded: what the prefill reads
  valid: jax.Array    # [B, P] bool
  lead: jax.Array     # [B] int32 prompt tokens at the start of the first decoded block
  head: jax.Array     # [B, b] int32 the first decoded block before its first step: the


                      # prompt's last `lead` tokens, then masks


def prompt_lead(prompt_valid, block_size: int, placement: str):
  """[B] int32 prompt tokens each row's first decoded block starts with: n mod b with
  absolute placement (n = the row's prompt tokens), 0 at the prompt's end."""
  n = jnp.sum(prompt_valid, axis=-1, dtype=jnp.int32)
  return n % block_size if placement == "absolute" else jnp.zeros_like(n)


def row_blocks(lead, cfg: DecodeConfig, gen_length=None):
  """[B] int32 blocks each row decodes: enough to hold its `lead` prompt tokens and N more
  (`gen_length`: each row's own N [B], at most `cfg.gen_length`; default `cfg.gen_length`)."""
  n = cfg.gen_length if gen_length is None else gen_length
  return (lead + n + cfg.block_size - 1) // cfg.block_size


def place_prompts(prompt_tokens, prompt_valid, block_size: int, mask_id: int,
                  placement: str) -> Placed:
  """Prompts [B, P] (left-padded, P a multiple of b) on the block grid of `placement`
  (PLACEMENTS): each row shifted right by its `lead`, so its complete blocks end at P and its
  last `lead` tokens open the first decoded block. "prompt_end" changes nothing (lead 0)."""
  p, b = prompt_tokens.shape[1], block_size
  lead = prompt_lead(prompt_valid, b, placement)
  if placement != "absolute":
    head = jnp.full((prompt_tokens.shape[0], b), mask_id, jnp.int32)
    return Placed(prompt_tokens.astype(jnp.int32), prompt_valid.astype(bool), lead, head)
  src = jnp.arange(p, dtype=jnp.int32)[None, :] - lead[:, None]          # [B, P]
  take = lambda x, idx: jnp.take_along_axis(x, jnp.clip(idx, 0, p - 1), axis=1)
  tokens = take(prompt_tokens, src).astype(jnp.int32)
  valid = take(prompt_valid, src) & (src >= 0)
  col = jnp.arange(b, dtype=jnp.int32)[None, :]
  tail = take(prompt_tokens, p - lead[:, None] + col)                    # [B, b]
  head = jnp.where(col < lead[:, None], tail, mask_id).astype(jnp.int32)
  return Placed(tokens, valid, lead, head)


def place_for_decoder(prompt_tokens, prompt_valid, cfg: DecodeConfig) -> Placed:
  """`place_prompts` on the block grid of a decoder's config."""
  return place_prompts(prompt_tokens, prompt_valid, cfg.block_size, cfg.mask_id,
                       cfg.block_placement)


def fixed_positions(j, lead, block_size: int):
  """[B, b] bool positions of block j that hold prompt tokens (block 0's first `lead`): they
  are context, never masked, edited or part of the response."""
  return (j == 0) & (jnp.arange(block_size)[None, :] < lead[:, None])


def finished_response(blocks, lead, cfg: DecodeConfig):
  """Each row's response from its decoded blocks [B, M*b] (block j at [j*b, (j+1)*b); the
  response starts `lead` [B] tokens into block 0): (response [B, N] EOS-filled after the
  first EOS, tokens through the first EOS [B], an EOS was generated [B])."""
  n = cfg.gen_length
  response = jnp.take_along_axis(blocks, lead[:, None] + jnp.arange(n)[None, :], axis=1)
  response = jnp.where(response == cfg.mask_id, cfg.eos_id, response)  # never-decoded blocks
  is_eos = response == cfg.eos_id
  finished = jnp.any(is_eos, axis=-1)
  first_eos = jnp.where(finished, jnp.argmax(is_eos, axis=-1), n - 1)
  after = jnp.arange(n)[None, :] > first_eos[:, None]
  return jnp.where(after, cfg.eos_id, response), (first_eos + 1).astype(jnp.int32), finished


def final_blocks(blocks, lead, n_generated, finished, cfg: DecodeConfig):
  """`Capture.block_final` [B, M*b] from the decoded blocks: masks (blocks never decoded)
  and everything after the response's first EOS become EOS, as in the response."""
  pos = jnp.arange(blocks.shape[1])[None, :]
  cut = jnp.where(finished, lead + n_generated, blocks.shape[1])[:, None]
  return jnp.where((pos >= cut) | (blocks == cfg.mask_id), cfg.eos_id, blocks).astype(jnp.int32)
