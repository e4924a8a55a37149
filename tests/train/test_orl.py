"""ORL replay and losses. Rerun under other CPU numerics (`numerics`): the tests comparing one
batch's loss and metrics across packings, micro-batches or vocabulary chunks, whose confidence
gate (reference entropy < tau_conf) and AEC hinge signs are computed by each program anew."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode.capture import masked_positions
from orl_jax import losses
from orl_jax.decode.config import DecodeConfig
from orl_jax.config.sections import Loss
from orl_jax.losses import LossConfig, orl_loss
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.decode.trajectories import make_trajectories
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import TINY, TINY_RULES, replayed_vs_captured, tiny_model

B_SIZE, GEN, G = 4, 12, 3


def _rollout(attention, residual_mode="adapter"):
  model = tiny_model(7, residual_mode=residual_mode, attention=attention)
  if residual_mode == "adapter":
    st = nnx.state(model, nnx.Param)
    k = st["adapter"]["down_proj"]["kernel"]
    k[...] = 0.1 * jax.random.normal(jax.random.key(3), k[...].shape)   # a live pathway
    nnx.update(model, st)
  graphdef, params = nnx.split(model)
  cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=2,
                     rule=UnmaskRule("threshold", 0.2), temperature=1.0, capture_states=16,
                     **TINY_RULES)
  prompts = jax.random.randint(jax.random.key(0), (2, 8), 3, TINY.vocab_size)
  valid = jnp.arange(8)[None] >= jnp.array([1, 4])[:, None]
  traj = make_trajectories(graphdef, cfg, G)(params, prompts, valid, jax.random.key(5), 0)
  return graphdef, params, traj, np.asarray(valid)


@pytest.fixture(scope="module")
def rolled_out():
  return _rollout("block_causal")


def _perturbed(params, scale=0.05, seed=11):
  """A different model near `params` (a frozen KL reference the policy has moved away from)."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [x + scale * jnp.std(x) * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def reference(rolled_out):
  graphdef, params, _, _ = rolled_out
  return _perturbed(params)


# a random reference is never confident below 0.1
KL_CFG = LossConfig.from_section(Loss(gate_entropy=0.0, conf_entropy=0.99))
LR_SGD = 0.5


def _close(a, b, rtol=1e-5):
  """Equal up to rounding: tolerance relative to the largest magnitude compared."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(np.abs(a).max(initial=0), np.abs(b).max(initial=0), 1e-30)
  np.testing.assert_allclose(a, b, atol=rtol * scale, rtol=0)


def _plan(traj, valid, **kw):
  defaults = dict(row_len=160, n_rows=40, max_states=96, max_responses=8, block_size=B_SIZE,
                  response_blocks=GEN // B_SIZE, states_per_response=0, layout="packed",
                  micro_batches=1)
  defaults.update(kw)
  cap = jax.device_get(traj.capture)
  return build_plan(prompt_valid=valid, capture_valid=cap.valid, capture_block=cap.block,
                    eligible=np.ones(traj.responses.shape[0], bool), group_size=G,
                    cfg=ReplayConfig(**defaults),
                    rng=np.random.default_rng(0))


@pytest.mark.parametrize("layout", ["packed", "naive"])
def test_replay_reproduces_rollout_logits(rolled_out, layout):
  graphdef, params, traj, valid = rolled_out
  plan, stats = _plan(traj, valid, layout=layout)
  assert stats["states_dropped"] == 0 and stats["states_packed"] == int(traj.capture.valid.sum())
  replayed, captured, batch = replayed_vs_captured(graphdef, params, traj, plan)
  np.testing.assert_allclose(replayed, captured, atol=1e-4)
  # the residual really was consumed (states after a block's first step carry z != 0)
  is_state = np.asarray(plan.state_slot) >= 0
  assert np.abs(np.asarray(batch.residual.z)[is_state]).sum() > 0


def test_rcd_pathway_replay_reproduces_rollout_logits():
  """ORL can train an `rcd`-mode model: the interpolation weight alpha is captured with z."""
  graphdef, params, traj, valid = _rollout("block_causal", residual_mode="rcd")
  plan, _ = _plan(traj, valid)
  replayed, captured, batch = replayed_vs_captured(graphdef, params, traj, plan)
  np.testing.assert_allclose(replayed, captured, atol=1e-4)
  is_state = np.asarray(plan.state_slot) >= 0
  assert np.abs(np.asarray(batch.residual.alpha)[is_state]).sum() > 0


def test_bidirectional_canvas_replay_reproduces_rollout_logits():
  graphdef, params, traj, valid = _rollout("bidirectional")
  plan, stats = _plan(traj, valid, layout="canvas", row_len=60)
  assert stats["states_dropped"] == 0
  replayed, captured, _ = replayed_vs_captured(graphdef, params, traj, plan)
  np.testing.assert_allclose(replayed, captured, atol=1e-4)
  # the block-causal packing would not be exact for this family
  packed, _ = _plan(traj, valid, layout="packed")
  replayed, captured, _ = replayed_vs_captured(graphdef, params, traj, packed)
  assert np.abs(replayed - captured).max() > 1e-3


@pytest.mark.numerics
def test_packing_does_not_change_the_loss(rolled_out, reference):
  graphdef, params, traj, valid = rolled_out
  model, ref = nnx.merge(graphdef, params), nnx.merge(graphdef, reference)
  values = []
  for kw in (dict(layout="naive"), dict(row_len=64), dict(row_len=160), dict(row_len=400)):
    plan, stats = _plan(traj, valid, **kw)
    assert stats["states_dropped"] == 0
    batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
    loss, m = orl_loss(model, batch, KL_CFG, reference=ref)
    values.append([float(m[k]) for k in ("loss_ce", "loss_aec", "loss_rkl")] + [float(loss)])
    assert m["responses_aec"] > 0 and m["responses_kl"] > 0
  values = np.asarray(values)
  assert values[0, 2] > 1e-3 * values[0, 0]   # the anchor is a live term here, not rounding
  for v in values[1:]:
    for term in range(values.shape[1]):   # each term to rounding of its own magnitude
      _close(v[term], values[0, term])


def test_packed_rows_share_the_prompt(rolled_out):
  _, _, traj, valid = rolled_out
  packed, _ = _plan(traj, valid, row_len=400)
  naive, _ = _plan(traj, valid, layout="naive")
  n_prompt = lambda p: int((np.asarray(p.src_type) == 1).sum())
  assert n_prompt(packed) < n_prompt(naive) / 4


def test_gated_ce_hand_computed():
  nll = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0])
  masked = jnp.array([True, True, False, True, True])
  ent = jnp.array([0.5, 0.05, 0.9, 0.3, 0.3])
  resp = jnp.array([0, 0, 0, 1, 1])
  value, count = losses.gated_ce(nll, masked, ent, resp, 4, gate=0.0)
  assert count == 2 and math.isclose(float(value), ((1 + 2) / 2 + (4 + 5) / 2) / 2)
  value, _ = losses.gated_ce(nll, masked, ent, resp, 4, gate=0.1)   # drops the 0.05 position
  assert math.isclose(float(value), (1.0 + 4.5) / 2)


def test_aec_hinge_and_stop_gradient():
  h = jnp.array([0.4, 0.35, 0.2, 0.1])
  pa, pb = jnp.array([0, 1, 2]), jnp.array([1, 2, 3])
  pr, pv = jnp.array([0, 0, 1]), jnp.array([True, True, True])
  # rho = 0.25: pair (0,1): 0.35 - 0.75*0.4 = 0.05 -> 0.0025; (1,2): 0.2 - 0.2625 < 0 -> 0
  # (2,3) in response 1: 0.1 - 0.15 < 0 -> 0. Per response: r0 = 0.00125, r1 = 0.
  value, count, active = losses.aec(h, pa, pb, pr, pv, 4, rho=0.25)
  assert count == 2 and math.isclose(float(value), 0.00125 / 2, rel_tol=1e-5)
  assert math.isclose(float(active), 1 / 3, rel_tol=1e-6)
  grad = jax.grad(lambda h: losses.aec(h, pa, pb, pr, pv, 4, rho=0.25)[0])(h)
  assert float(grad[0]) == 0.0                                  # source entropy: stop-gradient
  assert math.isclose(float(grad[1]), 2 * 0.05 / 2 / 2, rel_tol=1e-4)  # d/dH1 of hinge^2 / 2 / 2


def test_capped_reverse_kl_cap_reached_and_not():
  # rollout distribution: top-2 ids {0, 1} with probs 0.7, 0.2, rest 0.1
  topk_ids = jnp.array([[0, 1], [0, 1]])
  topk_lp = jnp.log(jnp.array([[0.7, 0.2], [0.7, 0.2]]))
  q_close = jnp.log(jnp.array([0.6, 0.3, 0.05, 0.05]))
  q_far = jnp.log(jnp.array([0.001, 0.001, 0.499, 0.499]))
  logp = jnp.stack([q_close, q_far])
  masked = jnp.array([True, True])
  ent = jnp.array([0.05, 0.05])
  expected = 0.6 * math.log(0.6 / 0.7) + 0.3 * math.log(0.3 / 0.2) + 0.1 * math.log(0.1 / 0.1)
  value, _, kl = losses.capped_reverse_kl(logp, topk_ids, topk_lp, masked, ent, jnp.array([0, 1]),
                                          2, conf_entropy=0.1, cap=1.0)
  assert math.isclose(float(kl[0]), expected, rel_tol=1e-4)
  assert float(kl[1]) > 1.0
  assert math.isclose(float(value), (expected + 1.0) / 2, rel_tol=1e-4)  # far one capped at c
  # not confident in the rollout -> no anchor
  value, count, _ = losses.capped_reverse_kl(logp, topk_ids, topk_lp, masked, ent + 0.5,
                                             jnp.array([0, 1]), 2, conf_entropy=0.1, cap=1.0)
  assert float(value) == 0.0 and int(count) == 0


def _loss_and_grads(graphdef, params, traj, plan, micro_batches, n_shards=1, reference=None):
  from orl_jax.train.state import loss_and_grads
  batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
  cfg = KL_CFG if reference is not None else dataclasses.replace(KL_CFG, kl_reference="rollout")
  objective = losses.OrlObjective(cfg)
  fn = lambda p, b, r: loss_and_grads(graphdef, objective, p, b, jax.random.key(0),
                                      micro_batches=micro_batches, n_shards=n_shards,
                                      reference=r)
  # micro-batches: the loop of jitted calls the train step runs (one jit would unroll it)
  return (fn if micro_batches > 1 else jax.jit(fn))(params, batch, reference)


# naive: one state per row (AEC pairs always cross rows); packed rows of 24 tokens split
# responses across rows, so some pairs cross rows there too.
@pytest.mark.numerics
@pytest.mark.parametrize("layout,kw", [("naive", dict(row_len=20, n_rows=40)),
                                       ("packed", dict(row_len=24, n_rows=24)),
                                       ("packed", dict(row_len=64, n_rows=8, n_shards=2))])
def test_micro_batches_give_the_full_batch_loss_and_grads(rolled_out, reference, layout, kw):
  graphdef, params, traj, valid = rolled_out
  n_shards = kw.get("n_shards", 1)
  plan, stats = _plan(traj, valid, layout=layout, **kw)
  assert stats["states_dropped"] == 0 and stats["rows_used"] >= kw["n_rows"] // 2
  (loss, metrics), grads = _loss_and_grads(graphdef, params, traj, plan, 1, reference=reference)
  assert float(metrics["loss_aec"]) > 0 and float(metrics["loss_rkl"]) > 0
  for m in (2, 4):
    plan_m, _ = _plan(traj, valid, layout=layout, micro_batches=m, **kw)
    (loss_m, metrics_m), grads_m = _loss_and_grads(graphdef, params, traj, plan_m, m, n_shards,
                                                   reference=reference)
    assert int(metrics_m["aec_pairs_out_of_order"]) == 0
    _close(float(loss_m), float(loss))
    for k, v in metrics.items():
      np.testing.assert_allclose(float(metrics_m[k]), float(v), rtol=1e-5,
                                 atol=1e-5 * max(abs(float(v)), 1e-3), err_msg=k)
    for g, g_m in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_m)):
      _close(g_m, g, rtol=1e-4)


def test_micro_batches_need_aec_pairs_in_order(rolled_out):
  graphdef, params, traj, valid = rolled_out
  plan, _ = _plan(traj, valid, layout="naive", row_len=20, n_rows=40)
  (loss, _), _ = _loss_and_grads(graphdef, params, traj, plan, 1)
  # odd rows first: state k + 1 (odd row) is now trained a micro-batch before state k
  order = np.concatenate([np.arange(1, 40, 2), np.arange(0, 40, 2)])
  backwards = jax.tree.map(lambda x: x[order] if x.ndim == 2 else x, plan)
  (loss_b, metrics_b), _ = _loss_and_grads(graphdef, params, traj, backwards, 2)
  assert int(metrics_b["aec_pairs_out_of_order"]) > 0
  assert abs(float(loss_b) - float(loss)) > 1e-4


def test_replay_row_fields_are_the_fields_with_a_row_axis(rolled_out):
  """`split_rows` cuts exactly the fields `ReplayBatch.ROW_FIELDS` names: those must be the
  gathered fields whose every leaf is [R, T, ...]; the others (AEC pairs, state slots,
  counters) are per update. The reference's outputs are attached later, with rows."""
  import dataclasses as dc
  from orl_jax.packed_batch import PackedBatch, ReplayBatch
  _, _, traj, valid = rolled_out
  plan, _ = _plan(traj, valid, n_rows=40)
  batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
  assert type(batch) is ReplayBatch and isinstance(batch, PackedBatch)
  rows = batch.tokens.shape
  with_rows = {f.name for f in dc.fields(batch) if getattr(batch, f.name) is not None
               and all(x.shape[:2] == rows for x in jax.tree.leaves(getattr(batch, f.name)))}
  gathered = {f.name for f in dc.fields(batch) if getattr(batch, f.name) is not None}
  assert with_rows == set(ReplayBatch.ROW_FIELDS) & gathered
  assert {"ref_hidden", "ref_entropy"} <= set(ReplayBatch.ROW_FIELDS)
  assert set(PackedBatch.ROW_FIELDS) < set(ReplayBatch.ROW_FIELDS)


def test_the_plans_block_size_must_be_the_captured_states_width(rolled_out):
  """`ReplayConfig.block_size` (where the plan places states) and the capture's width (what
  the gather reads) come from one config today; a mismatch is refused, not mis-gathered."""
  from orl_jax.replay import abstract_batch
  _, _, traj, _ = rolled_out
  abstract = jax.eval_shape(lambda t: t, traj)
  cfg = dict(row_len=160, n_rows=40, max_states=96, max_responses=8,
             response_blocks=GEN // B_SIZE, states_per_response=0, layout="packed",
             micro_batches=1)
  gather = lambda t, p: gather_batch(t, p, mask_id=TINY.mask_id, unresolved=masked_positions)
  batch = abstract_batch(abstract, ReplayConfig(block_size=B_SIZE, **cfg), gather)
  assert batch.tokens.shape == (40, 160)
  with pytest.raises(ValueError, match=f"block size \\({2 * B_SIZE}.*width \\({B_SIZE}\\)"):
    abstract_batch(abstract, ReplayConfig(block_size=2 * B_SIZE, **cfg), gather)


def test_micro_batches_must_divide_the_rows(rolled_out):
  _, _, traj, valid = rolled_out
  with pytest.raises(ValueError, match="replay.micro_batches=3"):
    _plan(traj, valid, micro_batches=3, n_rows=40)
  from orl_jax.packed_batch import split_rows
  plan, _ = _plan(traj, valid, n_rows=40)
  batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
  with pytest.raises(ValueError, match="micro-batches"):
    split_rows(batch, 3)


@pytest.mark.numerics
def test_train_step_with_micro_batches_matches_one_batch(rolled_out):
  from orl_jax import sharding
  from orl_jax.optimizer import OptimizerConfig, make_optimizer
  from orl_jax.train.state import create_train_state, make_train_step
  _, params, traj, valid = rolled_out
  train = OptimizerConfig(lr=1e-3, warmup_steps=2, steps=10, final_lr_fraction=0.1, b1=0.9,
                          b2=0.98, weight_decay=0.01, grad_clip=1.0, residual_lr_scale=1.0,
                          freeze_base=False)
  optimizer, mesh = make_optimizer(train, residual_modules=("adapter",)), sharding.make_mesh()
  rows, repl = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  metrics = {}
  for m in (1, 4):
    plan, _ = _plan(traj, valid, layout="naive", row_len=20, n_rows=40, micro_batches=m)
    batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
    graphdef, state, state_sh = create_train_state(
        dataclasses.replace(TINY, residual_mode="adapter"), optimizer, mesh, 0, params=params,
        with_reference=True)
    step = make_train_step(graphdef, optimizer, losses.OrlObjective(KL_CFG),
                           mesh, state_sh, jax.tree.map(lambda x: rows if x.ndim >= 2 else repl,
                                                        batch), micro_batches=m)
    for _ in range(2):   # the returned (donated) state feeds the next step
      state, metrics[m] = step(state, batch, jax.random.key(0))
    assert int(state.step) == 2
  for k, v in metrics[1].items():
    np.testing.assert_allclose(float(metrics[4][k]), float(v), atol=1e-5, err_msg=k)


# --- the KL anchor to the frozen initial model (docs/method.md#the-losses) -----------------------

def _kl_loss(graphdef, batch, cfg=KL_CFG):
  def f(p, ref):
    return orl_loss(nnx.merge(graphdef, p), batch, cfg, reference=nnx.merge(graphdef, ref))
  return f


@pytest.fixture(scope="module")
def kl_batch(rolled_out):
  graphdef, params, traj, valid = rolled_out
  plan, _ = _plan(traj, valid)
  return gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)


def test_kl_to_reference_is_zero_at_start_and_live_after_a_change(rolled_out, reference,
                                                                  kl_batch):
  graphdef, params, _, _ = rolled_out
  f = jax.jit(_kl_loss(graphdef, kl_batch))
  _, at_start = f(params, params)            # ORL's first update: policy == reference
  _, moved = f(params, reference)
  assert int(moved["responses_kl"]) > 0
  assert float(moved["loss_rkl"]) > 1e-4
  assert abs(float(at_start["loss_rkl"])) <= 1e-6 * float(moved["loss_rkl"]) + 1e-9


def test_kl_only_step_decreases_it_and_no_gradient_reaches_the_reference(rolled_out, reference,
                                                                         kl_batch):
  graphdef, params, _, _ = rolled_out
  f = _kl_loss(graphdef, kl_batch)
  kl = jax.jit(lambda p, r: f(p, r)[1]["loss_rkl"])
  g_policy, g_ref = jax.jit(jax.grad(kl, argnums=(0, 1)))(params, reference)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(g_ref))
  # total loss too: the reference is a constant of the objective
  g_total_ref = jax.jit(jax.grad(lambda p, r: f(p, r)[0], argnums=1))(params, reference)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(g_total_ref))
  before = float(kl(params, reference))
  norm2 = sum(float(jnp.sum(g * g)) for g in jax.tree.leaves(g_policy))
  lr = 0.1 * before / norm2            # a step whose first-order decrease is 10% of the KL
  stepped = jax.tree.map(lambda p, g: p - lr * g, params, g_policy)
  after = float(kl(stepped, reference))
  assert after < 0.95 * before


@pytest.mark.numerics
def test_kl_anchor_in_the_vocabulary_chunks_equals_the_whole_vocabulary(rolled_out, reference,
                                                                        kl_batch):
  graphdef, params, _, _ = rolled_out
  vg = lambda cfg: jax.jit(jax.value_and_grad(
      lambda p: _kl_loss(graphdef, kl_batch, cfg)(p, reference)[1]["loss_rkl"]))(params)
  whole, g_whole = vg(KL_CFG)
  chunked, g_chunked = vg(dataclasses.replace(KL_CFG, vocab_chunk=7))
  _close(float(chunked), float(whole))
  for a, b in zip(jax.tree.leaves(g_chunked), jax.tree.leaves(g_whole)):
    _close(a, b, rtol=1e-4)


def test_anchor_weight_changes_the_second_update_not_the_first(rolled_out):
  """With w_kl 1 vs 0 the first update is the same (policy == reference: the KL and its gradient
  are zero in exact arithmetic) and the second differs (the policy moved, the anchor pulls
  back). Plain SGD after global-norm clipping keeps each update linear in its gradient: Adam
  would scale a rounding-level gradient difference up to a step of the learning rate's size on
  parameters whose other gradients vanish, and the warm-up of the project's optimizer makes its
  first update zero. "The same" and "differs" are measured against the size of one update, so
  rounding (which differs between CPUs) can decide neither."""
  import optax
  from orl_jax import sharding
  from orl_jax.train.state import create_train_state, make_train_step
  _, params, traj, valid = rolled_out
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(LR_SGD))
  mesh = sharding.make_mesh()
  plan, _ = _plan(traj, valid)
  batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
  rows, repl = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  batch_sh = jax.tree.map(lambda x: rows if x.ndim >= 2 else repl, batch)
  history = {}   # w_kl -> [(params after update i+1, loss_rkl at the params before it)]
  for w_kl in (0.0, 1.0):
    cfg = dataclasses.replace(KL_CFG, w_kl=w_kl)
    graphdef, state, state_sh = create_train_state(
        dataclasses.replace(TINY, residual_mode="adapter"), optimizer, mesh, 0, params=params,
        with_reference=cfg.uses_reference)
    step = make_train_step(graphdef, optimizer, losses.OrlObjective(cfg), mesh, state_sh, batch_sh)
    history[w_kl] = []
    for _ in range(2):
      state, metrics = step(state, batch, jax.random.key(0))
      history[w_kl].append((jax.device_get(state.params), float(metrics["loss_rkl"])))
    if cfg.uses_reference:   # the reference never moves
      for a, b in zip(jax.tree.leaves(state.reference), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  max_abs = lambda xs, ys: max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                               for a, b in zip(jax.tree.leaves(xs), jax.tree.leaves(ys)))
  diff = lambda i: max_abs(history[0.0][i][0], history[1.0][i][0])
  one_update = max_abs(history[1.0][0][0], params)
  kl = [h[1] for h in history[1.0]]
  assert diff(0) <= 1e-4 * one_update        # update 1: the same up to rounding
  assert diff(1) > 1e-2 * one_update         # update 2: the anchor changed it
  assert kl[1] > 1e-3                        # the policy is away from the reference ...
  assert abs(kl[0]) <= 1e-4 * kl[1]          # ... and was not at update 1: zero up to rounding


def test_term_grad_norms_are_each_terms_own_gradient(rolled_out, reference, kl_batch):
  """loss.term_grad_norms: `grad_norm_{ce,aec,anchor}` equal the norms of each weighted term's
  own gradient (taken here one term at a time), and the update's gradient is unchanged."""
  import optax
  from orl_jax.train.state import loss_and_grads
  graphdef, params, _, _ = rolled_out
  cfg = dataclasses.replace(KL_CFG, w_aec=30.0, w_kl=3.0)
  run = lambda c: jax.jit(lambda p, r: loss_and_grads(
      graphdef, losses.OrlObjective(c), p, kl_batch, jax.random.key(0), reference=r))
  (_, metrics), grads = run(dataclasses.replace(cfg, term_grad_norms=True))(params, reference)
  (_, plain), plain_grads = run(cfg)(params, reference)
  assert not any(k.startswith("grad_norm_") for k in plain)
  for g, g_plain in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
    _close(g, g_plain)
  f = _kl_loss(graphdef, kl_batch, cfg)
  for name, metric in (("ce", "loss_ce"), ("aec", "loss_aec_weighted"),
                       ("anchor", "loss_rkl_weighted")):
    own = jax.grad(lambda p, m=metric: f(p, reference)[1][m])(params)
    expected = float(optax.global_norm(own))
    assert expected > 0, name
    assert math.isclose(float(metrics[f"grad_norm_{name}"]), expected, rel_tol=1e-4), name


def test_term_grad_norms_need_one_micro_batch(rolled_out):
  from orl_jax.train.state import loss_and_grads
  graphdef, params, traj, valid = rolled_out
  plan, _ = _plan(traj, valid, layout="naive", row_len=20, n_rows=40, micro_batches=2)
  batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
  objective = losses.OrlObjective(dataclasses.replace(KL_CFG, term_grad_norms=True))
  with pytest.raises(ValueError, match="term_grad_norms needs micro_batches=1"):
    loss_and_grads(graphdef, objective, params, batch, jax.random.key(0), micro_batches=2)
