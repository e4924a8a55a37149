"""ORL rollouts with refill (`orl.rollout_rows`, `decode.schedule = "per_row"`): the P*G
responses decoded on fewer rows than responses, a row whose response ended taking the next one,
give every response the tokens, forward counts and captured states of decoding it alone. Rerun under
other CPU numerics (`numerics`): the refilled rollouts against decoding alone and the lock-step
rollout; not the validation and the choice of rollout."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode import per_row
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.decode.trajectories import make_trajectories, per_row_trajectories
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import (TINY, TINY_BLOCK, TINY_RULES, live_adapter, orl_smoke_config,
                                   tiny_model)

N_PROMPTS, GROUP, P, GEN = 4, 2, 8, 12
PAD_LEFT = [0, 3, 6, 4]
EOS = 5                    # an ordinary token of the random model: responses end early
COUNTS = ("nfe", "nfe_engine", "n_generated", "finished")


def _model(attention):
  model = tiny_model(3, residual_mode="adapter", attention=attention)
  return nnx.split(live_adapter(model, 0.05, 9))


def _prompts():
  tokens = jax.random.randint(jax.random.key(0), (N_PROMPTS, P), 3, TINY.vocab_size)
  return tokens, jnp.arange(P)[None] >= jnp.array(PAD_LEFT)[:, None]


def _close(a, b, rtol=1e-4):
  """Equal up to float rounding, relative to the largest magnitude compared."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(np.abs(a).max(initial=0), np.abs(b).max(initial=0), 1e-30)
  np.testing.assert_allclose(a, b, atol=rtol * scale, rtol=0)


def _assert_same_topk(ids, ref_ids, ref_logprobs, rtol=1e-4):
  """Top-k ids equal, except where rounding may order near-equal entries either way: a slot
  whose log-prob ties a neighbour's, or the last slot (its tie with the k+1-th is not seen)."""
  ids, ref_ids = np.asarray(ids), np.asarray(ref_ids)
  lp = np.asarray(ref_logprobs, np.float64)
  scale = max(np.abs(lp).max(initial=0), 1e-30)
  near = np.abs(np.diff(lp, axis=-1)) <= rtol * scale
  tie = np.zeros(ids.shape, bool)
  tie[..., :-1] |= near
  tie[..., 1:] |= near
  tie[..., -1] = True
  np.testing.assert_array_equal(np.where(tie, -1, ids), np.where(tie, -1, ref_ids),
                                err_msg="topk_ids")


def _assert_same_capture(cap, ref, i, j):
  """Row i of `cap` equals row j of `ref`: every Capture field (floats up to rounding; top-k
  ids where no near tie orders them)."""
  for name in ("block_tokens", "block", "step", "commit", "valid", "n_states", "overflow"):
    np.testing.assert_array_equal(getattr(cap, name)[i], getattr(ref, name)[j], err_msg=name)
  _assert_same_topk(cap.topk_ids[i], ref.topk_ids[j], ref.topk_logprobs[j])
  for name in ("z", "alpha", "entropy", "topk_logprobs"):
    _close(getattr(cap, name)[i], getattr(ref, name)[j])
  assert cap.routes is None and ref.routes is None


@pytest.fixture
def engine_calls(monkeypatch):
  """(rows, loop iterations) of every engine run the rollouts below make."""
  calls, decode_queue = [], per_row.decode_queue

  def spy(model, queue_tokens, queue_valid, key, cfg, n_rows, *rest, **named):
    out = decode_queue(model, queue_tokens, queue_valid, key, cfg, n_rows, *rest, **named)
    jax.debug.callback(lambda it: calls.append((n_rows, int(it))), out.iterations)
    return out
  monkeypatch.setattr(per_row, "decode_queue", spy)
  return calls


def _rollout(graphdef, params, cfg, n_rows, key, prefill_once=False):
  fn = functools.partial(per_row_trajectories, n_rows=n_rows, prefill_once=prefill_once)
  run = make_trajectories(graphdef, cfg, GROUP, rollout_fn=fn)
  return jax.device_get(run(params, *_prompts(), key, 0))


@pytest.mark.numerics
@pytest.mark.parametrize("attention,temperature,rule", [
    ("block_causal", 1.0, UnmaskRule("threshold", 0.3)),
    ("bidirectional", 1.0, UnmaskRule("entropy_budget", 0.4)),
])
def test_fewer_rows_decode_each_response_as_alone(engine_calls, attention, temperature, rule):
  """8 responses (4 prompts x 2) sampled at temperature 1 on 3 rows equal the same rollout on 8
  rows and each response decoded alone with the lock-step decoder and fold_in(key, i)."""
  graphdef, params = _model(attention)
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                     rule=rule, temperature=temperature, capture_states=3 * GEN,
                     **TINY_RULES)
  key = jax.random.key(4)
  few = _rollout(graphdef, params, cfg, 3, key)
  full = _rollout(graphdef, params, cfg, 0, key)        # 0: one row per response
  (rows_few, it_few), (rows_full, it_full) = engine_calls
  assert (rows_few, rows_full) == (3, N_PROMPTS * GROUP)
  assert it_few > it_full          # 3 rows took the 8 responses in turns: rows were refilled
  np.testing.assert_array_equal(few.responses, full.responses)
  for name in COUNTS:
    np.testing.assert_array_equal(getattr(few, name), getattr(full, name), err_msg=name)
  tokens, valid = _prompts()
  alone = lockstep_decoder(graphdef, cfg)
  for i in range(N_PROMPTS * GROUP):
    q = i // GROUP
    ref = jax.device_get(alone(params, tokens[q:q + 1], valid[q:q + 1], jax.random.fold_in(key, i)))
    np.testing.assert_array_equal(few.responses[i], ref.tokens[0], err_msg=f"response {i}")
    for name in COUNTS:
      assert getattr(few, name)[i] == getattr(ref, name)[0], (name, i)
    _assert_same_capture(few.capture, ref.capture, i, 0)
    _assert_same_capture(few.capture, full.capture, i, i)
  assert len(set(few.nfe_engine.tolist())) > 1, "responses should take different forwards"
  assert not np.all(few.responses[0::GROUP] == few.responses[1::GROUP]), "a group's samples differ"


@pytest.mark.numerics
def test_fewer_rows_greedy_equal_the_lockstep_rollout(engine_calls):
  """Greedy (where the lock-step and per-row schedules agree): 3 rows for 8 responses give the
  lock-step `rollout`'s responses, counts and captured states."""
  graphdef, params = _model("block_causal")
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                     rule=UnmaskRule("threshold", 0.3), temperature=0.0, capture_states=3 * GEN,
                     **TINY_RULES)
  key = jax.random.key(4)
  few = _rollout(graphdef, params, cfg, 3, key)
  lock = jax.device_get(make_trajectories(graphdef, cfg, GROUP)(params, *_prompts(), key, 0))
  assert engine_calls[0][0] == 3
  np.testing.assert_array_equal(few.responses, lock.responses)
  for name in COUNTS:
    np.testing.assert_array_equal(getattr(few, name), getattr(lock, name), err_msg=name)
  for i in range(N_PROMPTS * GROUP):
    _assert_same_capture(few.capture, lock.capture, i, i)
  np.testing.assert_array_equal(few.prompt_tokens, lock.prompt_tokens)


@pytest.mark.parametrize("overrides,match", [
    (dict(rollout_rows=-1), "orl.rollout_rows=-1 must be >= 0"),
    (dict(rollout_rows=4, schedule="lockstep"), "set decode.schedule='per_row' or"),
    (dict(rollout_rows=7), r"exceeds the 6 responses .* set orl.rollout_rows <= 6"),
])
def test_rollout_rows_is_validated(overrides, match):
  from orl_jax.config.build import ConfigError, build
  c = orl_smoke_config("unused")                       # 2 prompts x 3 responses
  c.decode.schedule = overrides.pop("schedule", "per_row")
  c.orl.rollout_rows = overrides["rollout_rows"]
  with pytest.raises(ConfigError, match=match):
    build(c)
  c.orl.rollout_rows = 6 if c.decode.schedule == "per_row" else 0
  build(c)


@pytest.mark.numerics
@pytest.mark.slow  # ~25 s: two ORL iterations through the training loop
def test_orl_trains_on_refilled_rollouts(tmp_path, engine_calls):
  """Two ORL iterations of the smoke shapes with 6 responses decoded on 4 rows: every update
  consumes its fresh rollout and packs its states."""
  import json
  from orl_jax.train.entry import train
  c = orl_smoke_config(tmp_path, steps=2)
  c.decode.schedule, c.orl.rollout_rows = "per_row", 4
  c.orl.rollout_segment_iterations = 0   # the engine in one program (segments: test_orl_overlap)
  train(c, progress=False)
  assert [rows for rows, _ in engine_calls if rows == 4] == [4, 4], engine_calls  # 2 rollouts
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1, 2]
  assert [r["rollout_id"] for r in rows] == [0, 1]
  assert all(r["rollout_uses"] == 1 and r["policy_lag"] == 0 for r in rows)
  assert all(r["responses_verified"] == 6 and r["states_packed"] > 0 for r in rows)
  assert all(np.isfinite(r["loss"]) for r in rows)


def test_the_loop_picks_the_rollout_of_the_schedule():
  """Lock-step: the default rollout; per_row: the engine on orl.rollout_rows rows, refused on
  more than one batch shard (the queue is one device-side array)."""
  import types
  from orl_jax.decode.build import sampler_of
  from orl_jax.decode.trajectories import lockstep_trajectories
  from orl_jax.config import build as run_config
  c = run_config.convert(orl_smoke_config("unused"))
  one, two = types.SimpleNamespace(shape={"data": 1}), types.SimpleNamespace(shape={"data": 2})
  rollout_fn = lambda mesh: sampler_of(c).rollout(mask_id=0, eos_id=1, mesh=mesh)[0]
  assert rollout_fn(one) is lockstep_trajectories
  c = c.replace(**{"decode.schedule": "per_row", "orl.rollout_rows": 4})
  fn = rollout_fn(one)
  assert fn.func is per_row_trajectories and fn.keywords == {"n_rows": 4}
  with pytest.raises(ValueError, match="orl.rollout_rows=4 decodes the rollout queue on one "
                     "batch shard: set mesh.data = mesh.fsdp = mesh.expert = 1"):
    rollout_fn(two)


@pytest.mark.numerics
@pytest.mark.parametrize("attention,n_rows,iterations,prefill_once", [
    ("block_causal", 3, 4, False), ("bidirectional", 0, 5, False), ("block_causal", 3, 4, True)])
def test_a_segmented_rollout_is_the_rollout(attention, n_rows, iterations, prefill_once):
  """The per-row rollout cut into segments of `iterations` loop iterations (the ORL loop
  verifies the responses retired after each): the same Trajectories, bit for bit, and each
  segment's retired responses are final (equal to the rollout's) and only grow; with
  `prefill_once`, the prompt pool filled by the first program serves the later ones."""
  from orl_jax.decode.trajectories import SegmentedRollout
  graphdef, params = _model(attention)
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                     rule=UnmaskRule("threshold", 0.3), temperature=1.0, capture_states=3 * GEN,
                     **TINY_RULES)
  key = jax.random.key(4)
  whole = _rollout(graphdef, params, cfg, n_rows, key, prefill_once)
  seg = SegmentedRollout(graphdef, cfg, GROUP, n_rows, iterations, prefill_once=prefill_once)
  tokens, valid = _prompts()
  carry = seg.start(params, tokens, valid, key)
  seen, segments = np.zeros(N_PROMPTS * GROUP, bool), 0
  while True:
    carry, retired = seg.advance(params, tokens, valid, key, carry)
    retired = jax.device_get(retired)
    segments += 1
    assert np.all(retired.done[seen]), "a retired response went back to decoding"
    seen = retired.done
    np.testing.assert_array_equal(retired.responses[seen], whole.responses[seen])
    if not retired.active:
      break
  assert seen.all() and segments > 2
  out = jax.device_get(seg.finish(params, tokens, valid, key, carry, 0))
  for path, a in jax.tree_util.tree_leaves_with_path(out):
    b = _leaf(whole, path)
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def _leaf(tree, path):
  for entry in path:
    tree = (getattr(tree, entry.name) if hasattr(entry, "name") else tree[entry.idx]
            if hasattr(entry, "idx") else tree[entry.key])
  return tree
