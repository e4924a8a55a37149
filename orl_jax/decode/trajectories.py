"""The block decoders' trajectories: the ORL stage's rollout with exact state capture
(docs/method.md#rollout-with-exact-state-capture).

`G` sampled responses per prompt are decoded with the current parameters by the same jitted
block decoder that evaluation uses, with capture switched on: every forward step records the
active block's tokens, the residual exactly as consumed, the prediction's entropy and top-K,
and the commit mask (with LLaDA2.1 token editing, edit steps are states too). With
`capture_routes` (MoE models), the expert ids of every forward are recorded as well: of each
step, of the prompt prefill and of each commit forward, so replay routes every token the
rollout routed exactly as it did. Everything stays in fixed-size device buffers.
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.decode import per_row
from orl_jax.models.decoded import ROUTE_DTYPE, Trajectories, trajectories
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import decode
from orl_jax.decode.placement import place_for_decoder


def _check_capture(cfg: DecodeConfig):
  if cfg.capture_states <= 0:
    raise ValueError("rollouts need decode capture: set capture_states > 0")


def lockstep_trajectories(model, prompt_tokens, prompt_valid, key, cfg: DecodeConfig,
                          group_size: int, rollout_step,
                          prefill_once: bool = False) -> Trajectories:
  """Decodes `group_size` responses per prompt (rows of a group are adjacent): the prompts
  repeated `group_size` times, one prompt forward per row; with `prefill_once`, one prompt
  forward per prompt whose KV cache serves the group's rows: the same trajectories where the
  compiled kernels do not depend on the batch size, off by default since XLA:CPU's YNNPACK
  fusions do (docs/method.md#the-prompt-is-prefilled-once)."""
  _check_capture(cfg)
  if prefill_once:
    out = decode(model, prompt_tokens, prompt_valid, key, cfg, group_size)
  else:
    reps = lambda x: jnp.repeat(x, group_size, axis=0)
    out = decode(model, reps(prompt_tokens), reps(prompt_valid), key, cfg)
  placed = place_for_decoder(prompt_tokens, prompt_valid, cfg)
  return trajectories(out, placed.tokens, placed.valid, rollout_step)


def per_row_trajectories(model, prompt_tokens, prompt_valid, key, cfg: DecodeConfig,
                         group_size: int, rollout_step, n_rows: int = 0,
                         prefill_once: bool = False) -> Trajectories:
  """`lockstep_trajectories` on the per-row engine (`decode.schedule = "per_row"`): the P*G
  responses are one queue decoded on `n_rows` rows (`orl.rollout_rows`; 0 = P*G, one row per
  response), a row whose response ended taking the next response of the queue. Response i
  samples with fold_in(key, i) and its states land in capture row i, as in
  `lockstep_trajectories`, whatever `n_rows`. With `prefill_once`, each prompt is prefilled
  once into a prompt pool that its group's rows copy (`per_row.decode_queue`'s `group_size`,
  docs/decoding.md#the-prompt-pool)."""
  _check_capture(cfg)
  reps = lambda x: jnp.repeat(x, group_size, axis=0)
  n_queue = prompt_tokens.shape[0] * group_size
  out = per_row.decode_queue(model, reps(prompt_tokens), reps(prompt_valid), key, cfg,
                            n_rows or n_queue, group_size if prefill_once else 1)
  placed = place_for_decoder(prompt_tokens, prompt_valid, cfg)
  return trajectories(out, placed.tokens, placed.valid, rollout_step)


class SegmentedRollout:
  """`per_row_trajectories` as a sequence of jitted programs, so that the host sees responses
  as their rows retire (the ORL loop verifies them while the rest decode): `start` -> carry;
  `advance` -> (carry, `per_row.Retired`) runs at most `iterations` loop iterations; `finish`
  -> the Trajectories `per_row_trajectories` returns for the same inputs (the same loop body,
  cut between iterations). Every program takes the iteration's (params, prompt_tokens,
  prompt_valid, key) and rebuilds the queue from them; the carry (rows, cache, capture) stays
  on the device and is donated from one program to the next; with `prefill_once`, the prompt
  pool that `start` fills travels in it."""

  def __init__(self, graphdef, cfg: DecodeConfig, group_size: int, n_rows: int,
               iterations: int, mesh=None, prefill_once: bool = False):
    _check_capture(cfg)
    if iterations < 1:
      raise ValueError(f"a segment runs at least one iteration, got {iterations}")
    self.iterations = iterations

    def queue(params, prompt_tokens, prompt_valid):
      reps = lambda x: jnp.repeat(x, group_size, axis=0)
      n_queue = prompt_tokens.shape[0] * group_size
      return (nnx.merge(graphdef, params), reps(prompt_tokens), reps(prompt_valid),
              n_rows or n_queue)

    def start(params, prompt_tokens, prompt_valid, key):
      model, tokens, valid, rows = queue(params, prompt_tokens, prompt_valid)
      return per_row.start_queue(model, tokens, valid, key, cfg, rows,
                                 group_size if prefill_once else 1)

    def advance(params, prompt_tokens, prompt_valid, key, carry):
      model, tokens, valid, rows = queue(params, prompt_tokens, prompt_valid)
      return per_row.advance_queue(model, tokens, valid, key, cfg, rows, carry, iterations)

    def finish(params, prompt_tokens, prompt_valid, key, carry, rollout_step):
      model, tokens, valid, rows = queue(params, prompt_tokens, prompt_valid)
      out = per_row.finish_queue(model, tokens, valid, key, cfg, rows, carry)
      placed = place_for_decoder(prompt_tokens, prompt_valid, cfg)
      return trajectories(out, placed.tokens, placed.valid, rollout_step)

    def jit(fn, n_args: int, **kwargs):
      if mesh is None:
        return jax.jit(fn, **kwargs)
      from orl_jax import sharding as sharding_lib
      rows = sharding_lib.batch_sharding(mesh)   # prompts split as make_trajectories splits them
      return jax.jit(fn, in_shardings=(None, rows, rows) + (None,) * (n_args - 3), **kwargs)

    self.start = jit(start, 4)
    self.advance = jit(advance, 5, donate_argnums=(4,))
    self._finish = jit(finish, 6, donate_argnums=(4,))

  def finish(self, params, prompt_tokens, prompt_valid, key, carry, rollout_step):
    """The Trajectories; the carry is donated (its capture buffers become the output's, the
    rows' state is dropped: JAX's warning that those buffers went unused is expected)."""
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
      return self._finish(params, prompt_tokens, prompt_valid, key, carry, rollout_step)


def make_trajectories(graphdef, cfg, group_size: int, mesh=None, rollout_fn=None):
  """Jitted `(params, prompt_tokens, prompt_valid, key, rollout_step) -> Trajectories`.

  With a mesh, prompts are split over the data axes and the rollout runs data-parallel (each
  shard decodes its prompts' groups; parameters keep their own shardings). `rollout_fn`: a
  family's own rollout with `lockstep_trajectories`' signature (default: `lockstep_trajectories`,
  the mask decoder).
  """
  rollout_fn = rollout_fn or lockstep_trajectories

  def run(params, prompt_tokens, prompt_valid, key, rollout_step):
    return rollout_fn(nnx.merge(graphdef, params), prompt_tokens, prompt_valid, key, cfg,
                      group_size, rollout_step)

  if mesh is None:
    return jax.jit(run)
  from orl_jax import sharding as sharding_lib
  rows = sharding_lib.batch_sharding(mesh)
  return jax.jit(run, in_shardings=(None, rows, rows, None, None))


def capture_bytes(n_rows: int, cfg: DecodeConfig, d_model: int, dtype_bytes: int) -> int:
  """Bytes of the capture buffers for `n_rows` responses (reported by the dry-run)."""
  s, b, k = cfg.capture_states, cfg.block_size, cfg.top_k
  # z; block tokens, alpha, entropy; top-K ids and log-probs; commit; block, step; valid
  per_state = b * d_model * dtype_bytes + b * 4 * 3 + b * k * 8 + b + 2 * 4 + 1
  return n_rows * (s * per_state + 4 + 1)   # + n_states, overflow


def block_final_bytes(n_rows: int, cfg: DecodeConfig) -> int:
  """Bytes of `Capture.block_final` (the block decoder's final tokens of every block) that
  `capture_bytes` leaves out (a family with its own sampler records none)."""
  return n_rows * cfg.max_blocks * cfg.block_size * 4


def route_capture_bytes(n_rows: int, cfg: DecodeConfig, prompt_len: int, n_moe_layers: int,
                        top_k: int, blocks: int | None = None) -> int:
  """Bytes of the route buffers `capture_routes` adds to `capture_bytes` (the dry-run's
  capture row): K expert ids per MoE layer for every token of every captured state, of the
  prompt prefill and of the commit forwards of `blocks` blocks (`models.decoded.RouteCapture`;
  None: N / b, the block decoder's `max_blocks` with absolute placement)."""
  if not cfg.capture_routes:
    return 0
  blocks = cfg.gen_length // cfg.block_size if blocks is None else blocks
  tokens = cfg.capture_states * cfg.block_size + prompt_len + blocks * cfg.block_size
  return n_rows * tokens * n_moe_layers * top_k * jnp.dtype(ROUTE_DTYPE).itemsize
