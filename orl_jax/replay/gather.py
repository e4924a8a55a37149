"""The device half of replay: gather a packed batch from the trajectories by the host-built
plan (`plan.py`). Only indices cross to the device; tokens, residuals and rollout statistics
are read where they were captured (MoE routes too, with `orl.capture_routes`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from orl_jax.packed_batch import ReplayBatch
from orl_jax.replay.plan import (SRC_CLEAN, SRC_MASK, SRC_PROMPT, SRC_STATE, ReplayConfig,
                                 ReplayPlan)
from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import TokenMeta


def gather_batch(traj, plan: ReplayPlan, *, mask_id: int, unresolved) -> ReplayBatch:
  """Device-side gather of a packed batch from trajectories (call under jit). The block size
  is the captured states' width (`Capture.block_tokens` [B, S, b]), the plan's
  `ReplayConfig.block_size`.

  `unresolved(state_tokens, commit, mask_id)` says which state positions the losses train
  (`ReplayBatch.masked`): the rollout sampler's `Sampler.unresolved` (the block samplers': the
  mask tokens of the captured block; replay asks, it does not assume)."""
  cap = traj.capture
  block_size = cap.block_tokens.shape[2]
  st = plan.src_type
  is_state = st == SRC_STATE
  resp, sidx, pos = plan.src_resp, plan.src_state, plan.src_pos
  prompt_tok = traj.prompt_tokens[plan.src_group, jnp.clip(pos, 0, traj.prompt_tokens.shape[1] - 1)]
  # each decoded block's final tokens, block j at [j*b, (j+1)*b): the mask decoders record
  # them (with absolute placement block 0 opens with the prompt's last tokens); a family
  # whose responses are the blocks themselves (DiffusionGemma) records none
  blocks = traj.responses if cap.block_final is None else cap.block_final
  n = blocks.shape[1]
  clean_tok = blocks[resp, jnp.clip(pos, 0, n - 1)]
  state_pos = jnp.clip(pos, 0, block_size - 1)
  state_tok = cap.block_tokens[resp, sidx, state_pos]
  tokens = jnp.where(st == SRC_PROMPT, prompt_tok,
                     jnp.where(st == SRC_CLEAN, clean_tok,
                               jnp.where(is_state, state_tok,
                                         jnp.where(st == SRC_MASK, mask_id, 0))))
  resp_block = cap.block[resp, sidx]
  target = blocks[resp, jnp.clip(resp_block * block_size + state_pos, 0, n - 1)]
  z = jnp.where(is_state[..., None], cap.z[resp, sidx, state_pos], 0)
  alpha = jnp.where(is_state, cap.alpha[resp, sidx, state_pos], 0)
  sel = lambda x: jnp.where(is_state.reshape(is_state.shape + (1,) * (x.ndim - 2)), x, 0)
  return ReplayBatch(
      tokens=tokens.astype(jnp.int32), positions=jnp.asarray(plan.positions),
      meta=TokenMeta(*(jnp.asarray(f) for f in plan.meta)), residual=Residual(z, alpha),
      targets=jnp.where(is_state, target, 0).astype(jnp.int32),
      masked=is_state & unresolved(tokens, cap.commit[resp, sidx, state_pos], mask_id),
      rollout_entropy=sel(cap.entropy[resp, sidx, state_pos]),
      topk_ids=sel(cap.topk_ids[resp, sidx, state_pos]),
      topk_logprobs=sel(cap.topk_logprobs[resp, sidx, state_pos]),
      state_slot=jnp.asarray(plan.state_slot), resp_slot=jnp.asarray(plan.resp_slot),
      pair_a=jnp.asarray(plan.pair_a), pair_b=jnp.asarray(plan.pair_b),
      pair_resp=jnp.asarray(plan.pair_resp), pair_valid=jnp.asarray(plan.pair_valid),
      state_resp=jnp.asarray(plan.state_resp), n_responses=jnp.asarray(plan.n_responses),
      rollout_step=traj.rollout_step, routes=gather_routes(traj, plan, block_size))


def check_block_width(cfg: ReplayConfig, traj) -> None:
  """The plan places states `cfg.block_size` wide (`ReplayConfig.block_size`); the gather reads
  the captured states' width (`Capture.block_tokens` [B, S, b]). A ValueError where they differ
  (shapes are static: checked once, on the abstract rollout)."""
  width = traj.capture.block_tokens.shape[2]
  if width != cfg.block_size:
    raise ValueError(f"the replay plan's block size ({cfg.block_size}, ReplayConfig.block_size) "
                     f"differs from the captured states' width ({width}): the rollout and the "
                     "replay must be built from the same decode.block_size")


def abstract_batch(traj, cfg: ReplayConfig, gather_fn):
  """Shapes of one replay batch gathered from (abstract) `traj` by any plan of `cfg`
  (`gather_fn(traj, plan)`: `gather_batch` with the sampler's `unresolved`), after
  `check_block_width`."""
  check_block_width(cfg, traj)
  return jax.eval_shape(gather_fn, traj, ReplayPlan.abstract(cfg))


def gather_routes(traj, plan: ReplayPlan, block_size: int):
  """[R, T, L_moe, K] int32 routes of the packed tokens, or None without route capture: a
  prompt token takes the prefill's routes (the group's first response: its G copies were one
  batched prefill of the same tokens), a clean token its block's commit forward, a state token
  its step's forward; padding and masks of the canvas layout get -1 (route afresh; nothing
  sees padding, and the canvas layout captures no routes)."""
  routes = traj.capture.routes
  if routes is None:
    return None
  st, resp, sidx, pos = plan.src_type, plan.src_resp, plan.src_state, plan.src_pos
  group_size = traj.responses.shape[0] // traj.prompt_tokens.shape[0]
  prompt = routes.prompt[plan.src_group * group_size,
                         jnp.clip(pos, 0, routes.prompt.shape[1] - 1)]
  clean = routes.clean[resp, jnp.clip(pos, 0, routes.clean.shape[1] - 1)]
  state = routes.state[resp, sidx, jnp.clip(pos, 0, block_size - 1)]
  pick = lambda src, x, other: jnp.where((st == src)[..., None, None], x, other)
  out = pick(SRC_PROMPT, prompt, pick(SRC_CLEAN, clean, pick(SRC_STATE, state, -1)))
  return out.astype(jnp.int32)
