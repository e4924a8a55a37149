"""MoE route capture for DiffusionGemma (exact capture on MoE,
docs/method.md#rollout-with-exact-state-capture; `orl.capture_routes`): its
softmax-routed MoE runs in every layer, so the rollout records the expert ids of every forward
it ran — each denoising step's canvas, the prompt prefill, each commit forward — and the packed
replay routes every token with them (-1 = route afresh).

The rollout is the perturbed tiny random model of tests/support/diffusion_gemma.py (sliding
window shorter than the prompt, three canvases, left padding, two responses per prompt).
Re-routing in f32 reproduces the rollout too (its rounding differences are ~1e-6, far from
any near-tie this seed has); what route capture must guarantee is checked directly: the routes
cover exactly the forwards that ran, the replay with them equals the rollout's logits, and the
replay really routes by them (other routes give other logits).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.models.diffusion_gemma import trajectories as dg_trajectories
from orl_jax.packed_batch import layer_routes
from orl_jax.models.diffusion_gemma.decoding import not_accepted
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.decode.trajectories import make_trajectories
from pallas_kernels.staircase_attention import KIND_PAD
from tests.support.diffusion_gemma import (CANVAS, CFG, GROUP, N_CANVASES, PROMPT, RTOL,
                                           SAMPLER, STEPS, perturbed_model, rollout_logits,
                                           rollout_prompts, state_tokens)

# compares token ids, forward counts or signs: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics


@functools.lru_cache(maxsize=None)
def _rollout(capture_routes: bool):
  model = perturbed_model()
  graphdef, params = nnx.split(model, nnx.Param)
  prompt, valid = rollout_prompts()
  scfg = dataclasses.replace(SAMPLER, capture_routes=capture_routes)
  traj = make_trajectories(graphdef, scfg, GROUP, rollout_fn=dg_trajectories.sampler_trajectories)(
      params, prompt, valid, jax.random.key(3), 0)
  return model, traj


def _packed(traj):
  cap = jax.device_get(traj.capture)
  rcfg = ReplayConfig(row_len=256, n_rows=2, max_states=48, max_responses=4, block_size=CANVAS,
                      states_per_response=0, layout="packed", micro_batches=1,
                      context="token")
  plan, stats = build_plan(prompt_valid=np.asarray(traj.prompt_valid), capture_valid=cap.valid,
                           capture_block=cap.block, eligible=np.ones(4, bool),
                           group_size=GROUP, cfg=rcfg,
                           rng=np.random.default_rng(0))
  assert stats["states_dropped"] == 0
  return gather_batch(traj, plan, mask_id=-1, unresolved=not_accepted), plan


def _replayed_logits(model, batch, routes):
  hidden, _, _ = model.hidden_states(batch.tokens, batch.positions, batch.meta,
                                     residual=batch.residual, routes=routes)
  return np.asarray(model.head(hidden))


@pytest.mark.slow   # compiles a second rollout (without capture): ~2 min on 2 loaded cores
def test_route_capture_changes_nothing_in_the_rollout():
  _, plain = _rollout(False)
  _, captured = _rollout(True)
  assert plain.capture.routes is None
  np.testing.assert_array_equal(np.asarray(plain.responses), np.asarray(captured.responses))
  # the same program up to XLA's fusion choices: f32 rounding (amplified along the
  # self-conditioning z-chain), not a decision, may differ
  plain_lp = np.asarray(plain.capture.topk_logprobs)
  err = np.abs(np.asarray(captured.capture.topk_logprobs) - plain_lp).max()
  assert err <= RTOL * np.abs(plain_lp).max(), err   # measured 1.4e-5
  np.testing.assert_array_equal(np.asarray(plain.capture.commit),
                                np.asarray(captured.capture.commit))


def test_captured_routes_cover_exactly_the_forwards_that_ran():
  _, traj = _rollout(True)
  cap = jax.device_get(traj.capture)
  r = cap.routes
  n_rows, n_layers = traj.responses.shape[0], len(CFG.layers)
  assert r.state.shape == (n_rows, N_CANVASES * STEPS, CANVAS, n_layers, CFG.top_k)
  assert r.prompt.shape == (n_rows, PROMPT, n_layers, CFG.top_k)
  assert r.clean.shape == (n_rows, N_CANVASES * CANVAS, n_layers, CFG.top_k)
  # every denoising step that counted, and nothing else
  np.testing.assert_array_equal(np.all(r.state >= 0, axis=(2, 3, 4)), cap.valid)
  np.testing.assert_array_equal(np.all(r.state < 0, axis=(2, 3, 4)), ~cap.valid)
  assert np.all(r.state < CFG.n_experts)
  # the prefill's real prompt tokens (left padding routes nothing)
  row_valid = np.repeat(np.asarray(traj.prompt_valid), GROUP, axis=0)
  np.testing.assert_array_equal(np.all(r.prompt >= 0, axis=(2, 3)), row_valid)
  np.testing.assert_array_equal(np.all(r.prompt < 0, axis=(2, 3)), ~row_valid)
  # a commit forward after every canvas the row decoded, except the last canvas (none runs)
  decoded = np.zeros((n_rows, N_CANVASES), bool)
  for row in range(n_rows):
    decoded[row, np.unique(cap.block[row][cap.valid[row]])] = True
  clean = np.all(r.clean >= 0, axis=(2, 3)).reshape(n_rows, N_CANVASES, CANVAS)
  assert np.all(clean == clean[..., :1])                   # whole canvases
  want = decoded & (np.arange(N_CANVASES) < N_CANVASES - 1)[None]
  np.testing.assert_array_equal(clean[..., 0], want)
  assert want.sum() >= n_rows                               # canvases 0 and 1 committed


def test_replay_with_captured_routes_reproduces_the_rollouts_logits():
  model, traj = _rollout(True)
  batch, plan = _packed(traj)
  routes = np.asarray(batch.routes)                                    # [R, T, L, K]
  real = np.asarray(batch.meta.kind) != KIND_PAD
  # every real token of the rows (prompt, committed context, states) carries its routes
  assert np.all(routes[real] >= 0) and np.all(routes[~real] < 0)
  rows, cols, resp, sidx, pos = state_tokens(plan)
  replayed = _replayed_logits(model, batch, layer_routes(batch))[rows, cols]
  ref = rollout_logits(model, traj)[resp, sidx, pos]
  err = np.abs(replayed - ref).max() / np.abs(ref).max()
  rerouted = _replayed_logits(model, batch, None)[rows, cols]
  err_fresh = np.abs(rerouted - ref).max() / np.abs(ref).max()
  print(f"replay vs rollout, max|Δ| / max|logit|: captured routes {err:.2e}, "
        f"re-routed {err_fresh:.2e} ({len(rows)} state tokens)")
  assert err <= RTOL
  # the logits vary across states by far more than the tolerance: not a loose bar
  assert np.abs(ref - ref.mean(axis=0)).max() / np.abs(ref).max() > 100 * RTOL


def test_replay_routes_by_the_captured_routes():
  """Other routes (each captured expert id moved to the next expert) give other logits: the
  replay forward takes its experts from the batch, not from its own router."""
  model, traj = _rollout(True)
  batch, plan = _packed(traj)
  rows, cols, *_ = state_tokens(plan)
  want = _replayed_logits(model, batch, layer_routes(batch))[rows, cols]
  moved = jnp.where(batch.routes >= 0, (batch.routes + 1) % CFG.n_experts, -1)
  other = _replayed_logits(model, batch.replace(routes=moved),
                           jnp.moveaxis(moved, 2, 0))[rows, cols]
  assert np.abs(other - want).max() / np.abs(want).max() > 100 * RTOL
