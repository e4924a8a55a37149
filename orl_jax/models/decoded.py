"""What every decoder returns and every rollout hands to replay
(docs/decoding.md#one-denoising-step, docs/method.md#rollout-with-exact-state-capture): the captured
states (`Capture`, with the MoE routes of every forward, `RouteCapture`), a decode's output
(`DecodeOutput`) and a rollout's (`Trajectories`).

Plain types that the decoders (`orl_jax.decode.lockstep`, `orl_jax.decode.per_row`, a family's
own sampler under `orl_jax.models`), the rollouts and replay all share, so that a family folder
can build them without importing the decoders.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

ROUTE_DTYPE = jnp.int16   # captured expert ids (-1 = none); LLaDA2 has 256 experts


class RouteCapture(NamedTuple):
  """The MoE routes of every forward a rollout ran (`capture_routes`), token-major, so replay
  rows gather them like tokens. Entries are expert ids, -1 where no forward routed the token."""
  state: jax.Array    # [B, S, b, L_moe, K] each captured step's routes of the active block
  prompt: jax.Array   # [B, P, L_moe, K] the prompt prefill's routes
  clean: jax.Array    # [B, M*b, L_moe, K] each block's commit forward, block j at [j*b, (j+1)*b)
                      # (M = max_blocks; -1: none ran, e.g. after the last block)


class Capture(NamedTuple):
  """Every forward step of a rollout, exactly as consumed. Shapes [B, S, ...], S = max states."""
  block_tokens: jax.Array   # [B, S, b] int32 tokens of the active block before the step
  block: jax.Array          # [B, S] int32 block index within the response
  step: jax.Array           # [B, S] int32 step index within the block
  z: jax.Array              # [B, S, b, D] residual soft embedding consumed by the step
  alpha: jax.Array          # [B, S, b] residual entropy weight consumed (rcd)
  entropy: jax.Array        # [B, S, b] normalized entropy of the step's prediction (T = 1)
  topk_ids: jax.Array       # [B, S, b, K] int32
  topk_logprobs: jax.Array  # [B, S, b, K] f32
  commit: jax.Array         # [B, S, b] bool positions the step wrote (unmasked or edited)
  valid: jax.Array          # [B, S] bool
  n_states: jax.Array       # [B] int32 states recorded (capped at S)
  overflow: jax.Array       # [B] bool more steps happened than S could hold
  routes: RouteCapture | None = None   # MoE expert ids of every forward (capture_routes)
  # [B, M*b] int32 each decoded block's final tokens, block j at [j*b, (j+1)*b) (M =
  # max_blocks): with absolute placement block 0 starts with the prompt's last `lead` tokens;
  # EOS after the response's first EOS and in blocks never decoded. Replay reads clean blocks
  # and targets here. None: a family whose responses are the blocks (DiffusionGemma).
  block_final: jax.Array | None = None


class DecodeOutput(NamedTuple):
  """What every decoder returns (`orl_jax.decode.build`), one row per prompt (the per-row engine:
  per queued prompt, [Q, ...])."""
  tokens: jax.Array         # [B, N] response, EOS-filled after the first EOS
  nfe: jax.Array            # [B] int32 forwards, the paper's count: steps + 1 commit per block
  nfe_engine: jax.Array     # [B] int32 forwards the engine ran (commits nobody needs skipped)
  nfe_denoise: jax.Array    # [B] int32 denoising forwards only (the authors' count)
  n_generated: jax.Array    # [B] int32 tokens through the first EOS
  finished: jax.Array       # [B] bool an EOS was generated
  capture: Capture | None
  iterations: jax.Array | None = None   # scalar int32 forwards the per-row engine's loop ran
                                        # (each over all its rows); None: other decoders


def token_major_routes(expert_ids) -> jax.Array:
  """A forward's routes [L_moe, B, T, K] -> [B, T, L_moe, K] in the capture dtype."""
  return jnp.moveaxis(expert_ids, 0, 2).astype(ROUTE_DTYPE)


@struct.dataclass
class Trajectories:
  prompt_tokens: jax.Array   # [P, Lp] int32 each prompt as the rollout's prefill read it (one
                             # copy per prompt): left-padded, its complete blocks only with
                             # absolute placement (`decode.placement.place_prompts`; the
                             # prompt's last tokens open the first block, `Capture.block_final`)
  prompt_valid: jax.Array    # [P, Lp] bool
  responses: jax.Array       # [P*G, N] int32 final tokens (EOS-filled); row i is prompt i // G
  nfe: jax.Array             # [P*G] int32 forwards, the paper's count (`DecodeOutput`)
  nfe_engine: jax.Array      # [P*G] int32 forwards the engine ran
  n_generated: jax.Array     # [P*G] int32
  finished: jax.Array        # [P*G] bool
  capture: Capture           # [P*G, S, ...] every forward step
  rollout_step: jax.Array    # scalar int32: the update these trajectories were drawn for
  nfe_denoise: jax.Array | None = None  # [P*G] int32 denoising forwards only, the authors'
                                        # count (DiffusionGemma: transformers' TPF denominator)


def trajectories(out: DecodeOutput, prompt_tokens, prompt_valid, rollout_step) -> Trajectories:
  """The one way `Trajectories` are made: a decoder's output with capture (`DecodeOutput`)
  of the prompts [P, Lp] — as the decoder's prefill
  read them — repeated G times, drawn for update `rollout_step`."""
  if out.capture is None:
    raise ValueError("trajectories need the decoder's capture: decode with capture_states > 0")
  return Trajectories(prompt_tokens=prompt_tokens, prompt_valid=prompt_valid,
                      responses=out.tokens, nfe=out.nfe, nfe_engine=out.nfe_engine,
                      n_generated=out.n_generated, finished=out.finished, capture=out.capture,
                      rollout_step=jnp.asarray(rollout_step, jnp.int32),
                      nfe_denoise=out.nfe_denoise)
