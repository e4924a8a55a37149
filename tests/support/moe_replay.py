"""A sampled rollout of a tiny random LLaDA2-shaped MoE model (lock-step or per-row, with or
without route capture) and its packed replay: the tests of exact replay on MoE
(tests/replay/test_moe_replay.py and the tests that reuse its rollout)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.decode.capture import masked_positions
from orl_jax.decode.config import DecodeConfig
from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ModelConfig
from orl_jax.packed_batch import layer_routes
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.decode.trajectories import make_trajectories, per_row_trajectories
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import TINY_RULES
from tests.support.llada2 import build_model, random_flat_params

MOE = MoEConfig(n_experts=8, top_k=2, expert_dim=12, n_group=4, topk_group=2, n_shared=1,
                routed_scaling_factor=2.5, impl="dense")
# LLaDA2-shaped (partial RoPE, q/k norm, a dense first layer) with a live residual adapter
CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                  mlp_dim=40, mask_id=1, rope_theta=6e5, rope_fraction=0.5, qk_norm=True,
                  moe=MOE, first_k_dense=1, residual_mode="adapter", residual_hidden=32)
B_SIZE, GEN, G, EOS = 4, 12, 3, 2
PER_ROW_ROWS = 4   # the per-row rollout's rows: fewer than its 2 x G responses (refills)


@functools.lru_cache(maxsize=None)
def moe_rollout(dtype: str, capture_routes: bool, edit_threshold: float = 1.0, post: int = 0,
                schedule: str = "lockstep"):
  # bf16: the ragged expert compute (XLA:CPU has no bf16 x bf16 -> f32 dot for the dense one)
  moe = dataclasses.replace(MOE, impl="ragged" if dtype == "bfloat16" else "dense")
  cfg = dataclasses.replace(CFG, dtype=dtype, moe=moe)
  graphdef, params = nnx.split(build_model(cfg, random_flat_params(cfg, seed=4)))
  dcfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=CFG.mask_id, eos_id=EOS,
                      rule=UnmaskRule("threshold", 0.5), temperature=1.0, capture_states=24,
                      capture_routes=capture_routes, edit_threshold=edit_threshold,
                      max_post_edit_steps=post, **TINY_RULES)
  prompts = jax.random.randint(jax.random.key(0), (2, 8), 3, CFG.vocab_size)
  valid = jnp.arange(8)[None] >= jnp.array([1, 4])[:, None]
  rollout_fn = (functools.partial(per_row_trajectories, n_rows=PER_ROW_ROWS)
                if schedule == "per_row" else None)
  traj = make_trajectories(graphdef, dcfg, G, rollout_fn=rollout_fn)(params, prompts, valid,
                                                                jax.random.key(5), 0)
  return graphdef, params, traj, np.asarray(valid), dcfg


def replay_batch(traj, valid):
  cap = jax.device_get(traj.capture)
  plan, stats = build_plan(
      prompt_valid=valid, capture_valid=cap.valid, capture_block=cap.block,
      eligible=np.ones(traj.responses.shape[0], bool), group_size=G,
      cfg=ReplayConfig(row_len=160, n_rows=24, max_states=160, max_responses=8,
                       block_size=B_SIZE, states_per_response=0, layout="packed",
                       micro_batches=1),
      rng=np.random.default_rng(0))
  assert stats["states_dropped"] == 0 and stats["states_packed"] == int(cap.valid.sum())
  return gather_batch(traj, plan, mask_id=CFG.mask_id, unresolved=masked_positions), plan


@functools.partial(jax.jit, static_argnums=(0, 3))
def _forward(graphdef, params, batch, with_routes: bool):
  model = nnx.merge(graphdef, params)
  routes = layer_routes(batch) if with_routes else None
  return model(batch.tokens, batch.positions, batch.meta, residual=batch.residual,
               routes=routes)


def replay_error(graphdef, params, batch, plan, with_routes: bool):
  """(max |replayed - captured| log-prob at the captured top-K over state tokens, relative to
  the largest replayed logit there; the forward's output)."""
  out = _forward(graphdef, params, batch, with_routes)
  is_state = np.asarray(plan.state_slot) >= 0
  logits = np.asarray(out.logits, np.float64)
  logp = np.asarray(jax.nn.log_softmax(out.logits.astype(jnp.float32), -1), np.float64)
  replayed = np.take_along_axis(logp, np.asarray(batch.topk_ids), -1)[is_state]
  captured = np.asarray(batch.topk_logprobs, np.float64)[is_state]
  return np.max(np.abs(replayed - captured)) / np.max(np.abs(logits[is_state])), out
