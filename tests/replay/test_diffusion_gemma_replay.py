"""Exact capture and replay for DiffusionGemma (docs/method.md#rollout-with-exact-state-capture,
docs/method.md#replay-states-packing-staircase-attention; issue: uniform-noise block diffusion whose
self-conditioning block is ORL's residual pathway).

A rollout of a perturbed tiny random model (sliding window shorter than the prompt, three
canvases, left-padded prompts, two responses per prompt) is captured; its states — canvases
with their noise tokens and the stored self-conditioning z — are packed two responses to a
prompt copy, the committed context as a token-causal stream, and replayed in one forward. The
replayed logits of every captured state must equal the rollout's (f32, max |Δ| ≤ 1e-4 of the
largest logit): against the rollout's own recorded top-K log-probabilities, and against an
independent recomputation through the sampler's code path (commit forwards into a KV cache,
then the canvas decoder on the captured canvas and z).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.models.diffusion_gemma import trajectories as dg_trajectories
from orl_jax.models.diffusion_gemma.model import DiffusionGemma
from orl_jax.models.diffusion_gemma.decoding import not_accepted
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.replay.plan import SRC_STATE
from orl_jax.decode.trajectories import make_trajectories
from tests.support.diffusion_gemma import (CANVAS, CFG, GROUP, RTOL, SAMPLER, STEPS,
                                           perturbed_model, rollout_logits, rollout_prompts,
                                           state_tokens)


@pytest.fixture(scope="module")
def rollout_and_replay():
  model = perturbed_model()
  graphdef, params = nnx.split(model, nnx.Param)
  prompt, valid = rollout_prompts()
  traj = make_trajectories(graphdef, SAMPLER, GROUP,
                           rollout_fn=dg_trajectories.sampler_trajectories)(
      params, prompt, valid, jax.random.key(3), 0)
  cap = traj.capture
  rcfg = ReplayConfig(row_len=256, n_rows=2, max_states=48, max_responses=4, block_size=CANVAS,
                      states_per_response=0, layout="packed", micro_batches=1,
                      context="token")
  plan, stats = build_plan(prompt_valid=np.asarray(valid), capture_valid=np.asarray(cap.valid),
                           capture_block=np.asarray(cap.block), eligible=np.ones(4, bool),
                           group_size=GROUP, cfg=rcfg,
                           rng=np.random.default_rng(0))
  batch = gather_batch(traj, plan, mask_id=-1, unresolved=not_accepted)
  hidden, _, ratio = model.hidden_states(batch.tokens, batch.positions, batch.meta,
                                         residual=batch.residual)
  return dict(model=model, traj=traj, plan=plan, stats=stats, batch=batch,
              logits=np.asarray(model.head(hidden)), ratio=float(ratio))


def test_every_captured_state_is_packed(rollout_and_replay):
  r = rollout_and_replay
  cap = r["traj"].capture
  n_valid = int(np.asarray(cap.valid).sum())
  assert r["stats"]["states_packed"] == n_valid == r["stats"]["states_selected"]
  assert r["stats"]["states_dropped"] == 0 and n_valid > 2 * 4
  z = np.asarray(cap.z)
  assert not z[:, ::STEPS].any() and np.abs(z[:, 1]).max() > 0.1   # cold start, then z


def test_replay_reproduces_the_rollouts_logits(rollout_and_replay):
  r = rollout_and_replay
  cap = jax.tree.map(np.asarray, r["traj"].capture)
  rows, cols, resp, sidx, pos = state_tokens(r["plan"])
  replayed = r["logits"][rows, cols]                                         # [n, V]
  scale = np.abs(replayed).max()
  # 1. the rollout's own numbers: its top-K log-probabilities of every step
  logp = jax.nn.log_softmax(jnp.asarray(replayed), axis=-1)
  ids = cap.topk_ids[resp, sidx, pos]
  got = np.take_along_axis(np.asarray(logp), ids, axis=-1)
  err_topk = np.abs(got - cap.topk_logprobs[resp, sidx, pos]).max() / scale
  # 2. full logits against the sampler's code path (KV cache + canvas decoder)
  ref = rollout_logits(r["model"], r["traj"])[resp, sidx, pos]
  err = np.abs(replayed - ref).max() / np.abs(ref).max()
  print(f"max|Δ| / max|logit|: top-K log-probs {err_topk:.2e}, logits {err:.2e}; "
        f"{len(rows)} state tokens, max logit {scale:.2f}")
  assert err_topk <= RTOL and err <= RTOL
  # not a loose bar: the logits vary across states by far more than the tolerance
  assert np.abs(ref - ref.mean(axis=0)).max() / np.abs(ref).max() > 100 * RTOL


def test_the_sliding_window_and_the_stored_z_matter(rollout_and_replay):
  """Replay without the window, or with z recomputed as zeros, misses the rollout by far more
  than the tolerance — the two things exact replay has to get right are exercised."""
  r = rollout_and_replay
  batch = r["batch"]
  rows, cols, *_ = state_tokens(r["plan"])
  want = r["logits"][rows, cols]
  wide = DiffusionGemma(dataclasses.replace(CFG, sliding_window=10_000), rngs=nnx.Rngs(0))
  nnx.update(wide, nnx.state(r["model"], nnx.Param))
  hidden, _, _ = wide.hidden_states(batch.tokens, batch.positions, batch.meta,
                                    residual=batch.residual)
  no_window = np.asarray(wide.head(hidden))[rows, cols]
  hidden, _, _ = r["model"].hidden_states(batch.tokens, batch.positions, batch.meta,
                                          residual=None)
  no_z = np.asarray(r["model"].head(hidden))[rows, cols]
  scale = np.abs(want).max()
  assert np.abs(no_window - want).max() / scale > 100 * RTOL
  assert np.abs(no_z - want).max() / scale > 100 * RTOL
  assert r["ratio"] > 0.05


def test_unresolved_positions_and_targets(rollout_and_replay):
  """The losses train where a step did not accept, towards the verified final tokens."""
  r = rollout_and_replay
  cap = jax.tree.map(np.asarray, r["traj"].capture)
  rows, cols, resp, sidx, pos = state_tokens(r["plan"])
  batch = jax.tree.map(np.asarray, r["batch"])
  np.testing.assert_array_equal(batch.masked[rows, cols], ~cap.commit[resp, sidx, pos])
  assert batch.masked[rows, cols].any() and not batch.masked[rows, cols].all()
  final = np.asarray(r["traj"].responses)[resp, cap.block[resp, sidx] * CANVAS + pos]
  np.testing.assert_array_equal(batch.targets[rows, cols], final)
  np.testing.assert_array_equal(batch.tokens[rows, cols], cap.block_tokens[resp, sidx, pos])
  assert (batch.masked & (np.asarray(r["plan"].src_type) != SRC_STATE)).sum() == 0


def test_per_layer_remat_gives_the_same_replay_values_and_gradients(rollout_and_replay):
  """`model.remat` recomputes each layer of the packed replay forward in the backward pass (a
  26B train step otherwise keeps every layer's activations): same loss and gradients, to float
  rounding, as keeping them."""
  r = rollout_and_replay
  batch = r["batch"]
  graph, params = nnx.split(r["model"], nnx.Param)
  remat_model = DiffusionGemma(dataclasses.replace(CFG, remat=True), rngs=nnx.Rngs(0))
  graph_remat, _ = nnx.split(remat_model, nnx.Param)

  def loss(g, p):
    hidden, _, _ = nnx.merge(g, p).hidden_states(batch.tokens, batch.positions, batch.meta,
                                                 residual=batch.residual)
    return jnp.mean(jax.nn.log_softmax(nnx.merge(g, p).head(hidden))[..., 3])

  (la, ga), (lb, gb) = (jax.value_and_grad(lambda p, g=g: loss(g, p))(params)
                        for g in (graph, graph_remat))
  np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(ga))
  for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale)
  # and the recomputation is there: one recomputed call per layer, none without remat, each
  # layer's backward tied by two barriers (it waits for the layer's output cotangent; its
  # weight gradients leave with its input's: models/remat.py)
  jaxprs = [str(jax.make_jaxpr(lambda p, g=g: loss(g, p))(params)) for g in (graph, graph_remat)]
  assert [j.count("custom_vjp_call[") for j in jaxprs] == [0, len(CFG.layers)]
  grads = [str(jax.make_jaxpr(jax.grad(lambda p, g=g: loss(g, p)))(params))
           for g in (graph, graph_remat)]
  assert [j.count("optimization_barrier") for j in grads] == [0, 2 * len(CFG.layers)]
