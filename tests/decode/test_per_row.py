"""The per-row engine (continuous batching, `decode.schedule = "per_row"`): every queued prompt
decodes exactly as it would alone with `decode.lockstep.decode`, whichever row takes it and whatever
the other rows do, and rows that finish early do not wait for the batch. Rerun under other CPU
numerics (`numerics`): the tests comparing tokens and forward counts of two programs; not the
schedule's validation and the shapes."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.decode.per_row import make_engine
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import TINY, TINY_BLOCK, TINY_RULES, live_adapter, tiny_model

Q, ROWS, P, GEN = 7, 3, 8, 12
PAD_LEFT = [0, 3, 6, 4, 0, 1, 8]     # the last prompt is all padding
EOS = 5                              # an ordinary token of the random model: rows end early
# The all-padding prompt's first step is an exact tie: every masked position attends to the
# same values (mask embeddings only), so all of them have the same hidden state and the same
# distribution, and which one commits first is decided by rounding. Rounding differs between
# batch shapes and between CPUs (XLA promises neither batch invariance nor one rounding per
# instruction set), so that prompt is compared with its lone decode only in what the tie does
# not decide; every other prompt has distinct tokens and is compared exactly.
TIED = [q for q, pad in enumerate(PAD_LEFT) if pad == P]


def _model(attention):
  model = tiny_model(3, residual_mode="adapter", attention=attention)
  return nnx.split(live_adapter(model, 0.05, 9))


def _queue():
  prompts = jax.random.randint(jax.random.key(0), (Q, P), 3, TINY.vocab_size)
  valid = jnp.arange(P)[None] >= jnp.array(PAD_LEFT)[:, None]
  return prompts, valid


def _alone(graphdef, params, cfg, prompts, valid, key):
  """Each prompt decoded alone by the lock-step decoder with its own key fold_in(key, q)."""
  run = lockstep_decoder(graphdef, cfg)
  return [jax.device_get(run(params, prompts[q:q + 1], valid[q:q + 1], jax.random.fold_in(key, q)))
          for q in range(Q)]


def _close(a, b, rtol=1e-4):
  """Equal up to float rounding, relative to the largest magnitude compared."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(np.abs(a).max(initial=0), np.abs(b).max(initial=0), 1e-30)
  np.testing.assert_allclose(a, b, atol=rtol * scale, rtol=0)


def _assert_capture_equal(cap, q, ref):
  n = int(ref.n_states[0])
  assert int(cap.n_states[q]) == n and not bool(cap.overflow[q])
  np.testing.assert_array_equal(cap.valid[q], ref.valid[0])
  for name in ("block_tokens", "block", "step", "commit", "topk_ids"):
    np.testing.assert_array_equal(getattr(cap, name)[q], getattr(ref, name)[0], err_msg=name)
  for name in ("z", "alpha", "entropy", "topk_logprobs"):
    _close(getattr(cap, name)[q], getattr(ref, name)[0])


def _steps_per_block(cap, q: int, n_blocks: int) -> np.ndarray:
  """[blocks] denoising steps prompt q took in each block, from its captured states."""
  return np.array([np.sum(cap.valid[q] & (cap.block[q] == j)) for j in range(n_blocks)])


def _lockstep_forwards(steps: np.ndarray, rows: int) -> int:
  """Forwards the lock-step decoder runs on the queue in batches of `rows` for these decodes
  (`steps`: [Q, blocks]): per batch, the prefill, then per block the slowest row's steps and
  one commit forward when some row's later block needs it."""
  last = np.array([np.max(np.nonzero(s)[0]) for s in steps])   # the block each prompt ends in
  total = 0
  for start in range(0, len(steps), rows):
    batch = slice(start, start + rows)
    commits = [np.any(last[batch] > j) for j in range(steps.shape[1])]
    total += 1 + int(steps[batch].max(axis=0).sum()) + int(np.sum(commits))
  return total


def _assert_well_formed(out, q: int, cfg, attention: str):
  """What holds for any decode of prompt q, however its ties were broken: no mask left, EOS
  bookkeeping consistent with the tokens, and the paper's forward count = captured steps + one
  commit forward per decoded block (block-causal families; bidirectional ones have none)."""
  tokens = np.asarray(out.tokens[q])
  assert not np.any(tokens == cfg.mask_id), q
  eos = np.nonzero(tokens == cfg.eos_id)[0]
  assert bool(out.finished[q]) == (eos.size > 0), q
  assert int(out.n_generated[q]) == (eos[0] + 1 if eos.size else cfg.gen_length), q
  steps = _steps_per_block(out.capture, q, cfg.max_blocks)
  commits = np.count_nonzero(steps) if attention == "block_causal" else 0
  assert int(out.nfe[q]) == steps.sum() + commits, q


@pytest.mark.numerics
@pytest.mark.parametrize("attention,temperature,rule,rules", [
    ("block_causal", 0.0, UnmaskRule("threshold", 0.3), {}),
    ("block_causal", 1.0, UnmaskRule("entropy_budget", 0.4), {}),
    ("bidirectional", 0.0, UnmaskRule("threshold", 0.3), {}),
    ("bidirectional", 0.8, UnmaskRule("fixed_steps", 2), {}),
    # LLaDA2 / SDAR rules: blocks at absolute positions (prompts of 8, 5, 2, 4, 8, 7, 0
    # tokens share their last block with 0, 3, 2, 0, 0, 1, 0 generated ones), strict
    # threshold; without early stop (every block decoded), with token editing
    ("block_causal", 0.0, UnmaskRule("threshold", 0.3),
     dict(block_placement="absolute", commit_compare=">", eos_early_stop=False)),
    ("block_causal", 1.0, UnmaskRule("threshold", 0.3),
     dict(block_placement="absolute", commit_compare=">", edit_threshold=0.2,
          max_post_edit_steps=2)),
])
def test_each_queued_prompt_decodes_as_it_would_alone(attention, temperature, rule, rules):
  """Q = 7 prompts through 3 rows (refilled as responses end, EOS at different blocks, one
  all-padding prompt): tokens, NFE, generated counts and every captured state per prompt equal
  decoding that prompt alone (the all-padding prompt: its first state, and a well-formed decode;
  see TIED)."""
  graphdef, params = _model(attention)
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                     rule=rule, temperature=temperature, capture_states=(6 if rules else 3) * GEN,
                     **{**TINY_RULES, **rules})
  prompts, valid = _queue()
  key = jax.random.key(4)
  out = jax.device_get(make_engine(graphdef, cfg, ROWS)(params, prompts, valid, key))
  alone = _alone(graphdef, params, cfg, prompts, valid, key)
  for q, ref in enumerate(alone):
    _assert_well_formed(out, q, cfg, attention)
    if q in TIED:
      np.testing.assert_array_equal(out.capture.block_tokens[q][0], ref.capture.block_tokens[0][0])
      continue
    np.testing.assert_array_equal(out.tokens[q], ref.tokens[0], err_msg=f"prompt {q}")
    for name in ("nfe", "nfe_engine", "nfe_denoise", "n_generated", "finished"):
      assert getattr(out, name)[q] == getattr(ref, name)[0], (name, q)
    _assert_capture_equal(out.capture, q, ref.capture)
    np.testing.assert_array_equal(out.capture.block_final[q], ref.capture.block_final[0])
  steps = np.stack([_steps_per_block(out.capture, q, cfg.max_blocks) for q in range(Q)])
  ends = {int(np.max(np.nonzero(s)[0])) for s in steps}
  assert len(ends) > 1, "the case should have prompts ending in different blocks"
  if not rules.get("eos_early_stop", True):     # every prompt decodes all its blocks
    assert any(ref.finished[0] for ref in alone)
    assert {e + 1 for e in ends} <= {cfg.n_blocks, cfg.max_blocks}
  if attention == "block_causal" and temperature == 0 and not rules:
    # rows never wait: fewer forwards than the lock-step decoder on the same decodes; and each
    # iteration is some row's prefill block, step or commit (prefill blocks: non-padding ones)
    assert out.iterations < _lockstep_forwards(steps, ROWS)
    prefill_blocks = np.array([P // TINY_BLOCK - p // TINY_BLOCK for p in PAD_LEFT])
    assert out.iterations >= -(-np.sum(prefill_blocks + out.nfe_engine) // ROWS)


@pytest.mark.numerics
def test_rows_advance_independently_without_refill():
  """Two prompts on two rows, each slower than the other in some block: after the prefill the
  engine takes as many forwards as its slower row needs, where the lock-step decoder pays the
  slowest row of every block."""
  graphdef, params = _model("block_causal")
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=0,
                     rule=UnmaskRule("threshold", 0.15), capture_states=3 * GEN,
                     **TINY_RULES)
  prompts, valid = _queue()
  valid = jnp.ones_like(valid)                     # every row prefills P / b blocks
  key = jax.random.key(4)
  alone = _alone(graphdef, params, cfg, prompts, valid, key)
  steps = np.array([[np.sum(r.capture.valid[0] & (r.capture.block[0] == j))
                     for j in range(cfg.n_blocks)] for r in alone])
  pairs = [(a, b) for a in range(Q) for b in range(Q)
           if np.any(steps[a] > steps[b]) and np.any(steps[a] < steps[b])
           and not (alone[a].finished[0] or alone[b].finished[0])]     # all blocks decoded
  assert pairs, steps
  a, b = pairs[0]
  pair = np.array([a, b])
  out = jax.device_get(make_engine(graphdef, cfg, 2)(params, prompts[pair], valid[pair], key))
  np.testing.assert_array_equal(out.tokens, np.concatenate([alone[a].tokens, alone[b].tokens]))
  after_prefill = int(out.iterations) - P // TINY_BLOCK
  lockstep = int(np.maximum(steps[a], steps[b]).sum()) + cfg.n_blocks - 1   # + its commits
  assert after_prefill == max(int(alone[a].nfe_engine[0]), int(alone[b].nfe_engine[0]))
  assert after_prefill < lockstep


def test_schedule_is_validated():
  from configs import tiny
  from orl_jax.config.build import ConfigError, build
  config = tiny.get_config("eval")
  config.decode.schedule = "per_block"
  with pytest.raises(ConfigError, match="decode.schedule='per_block' must be one of"):
    build(config)
  config.decode.schedule = "per_row"
  build(config)
  # the engine records MoE routes (tests/replay/test_moe_replay.py)
  config.orl.capture_routes = True
  build(config)


def test_per_row_rollout_has_the_lockstep_rollouts_shapes():
  """The training loop sizes its replay batch from the rollout's abstract shapes: the per-row
  rollout's Trajectories must be the lock-step one's, field for field."""
  from orl_jax.decode.trajectories import make_trajectories, per_row_trajectories
  graphdef, params = _model("block_causal")
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                     rule=UnmaskRule("threshold", 0.3), temperature=1.0, capture_states=16,
                     **TINY_RULES)
  prompts, valid = _queue()
  args = (params, prompts[:2], valid[:2], jax.random.key(5), 0)
  shapes = [jax.eval_shape(make_trajectories(graphdef, cfg, 3, rollout_fn=fn), *args)
            for fn in (None, per_row_trajectories)]
  assert jax.tree.structure(shapes[0]) == jax.tree.structure(shapes[1])
  for a, b in zip(jax.tree.leaves(shapes[0]), jax.tree.leaves(shapes[1])):
    assert (a.shape, a.dtype) == (b.shape, b.dtype)


@pytest.mark.numerics
def test_evaluation_per_row_equals_lockstep_on_the_tiny_base():
  """Greedy evaluation of the committed tiny base model: the per-row queue (refilled rows)
  gives every problem the tokens and forward counts of the lock-step batches."""
  import os
  from configs import tiny
  from orl_jax import evaluate as eval_lib
  from orl_jax.setup.build import build_setup, initial_params
  config = tiny.get_config("eval")
  config.model.init_from = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "assets", "tiny_base")
  s = build_setup(config)
  config = s.config
  graphdef, params = initial_params(s)
  problems = s.task.eval_problems()[:20]
  rule = UnmaskRule("threshold", 0.9)
  lock = eval_lib.decode_problems(graphdef, params, problems, s.task, config, rule, batch_size=8)
  config = config.replace(**{"decode.schedule": "per_row"})
  per_row = eval_lib.decode_problems(graphdef, params, problems, s.task, config, rule,
                                     batch_size=8)
  for a, b in zip(lock[:4], per_row[:4]):      # tokens, nfe, nfe_engine, n_generated
    np.testing.assert_array_equal(a, b)


@pytest.mark.numerics
@pytest.mark.parametrize("attention", ["block_causal", "bidirectional"])
def test_the_engine_steps_with_the_masked_head(attention):
  """The engine's step is the lock-step decoder's (`decode.step.take_step`): without capture the
  head runs at the masked positions only (one head per width, `lax.switch`), with capture at
  every position; a sampled decode is the same either way (each row's Gumbel noise is the one
  its whole-block head would add, drawn from its own key)."""
  from orl_jax.decode.step import head_widths
  graphdef, params = _model(attention)
  base = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                      rule=UnmaskRule("entropy_budget", 0.4), temperature=1.0,
                      **TINY_RULES)
  captured = dataclasses.replace(base, capture_states=3 * GEN)
  prompts, valid = _queue()
  key = jax.random.key(4)

  def head_widths_in(cfg):
    text = str(jax.make_jaxpr(make_engine(graphdef, cfg, ROWS))(params, prompts, valid, key))
    return {w for w in head_widths(TINY_BLOCK) if f"f32[{ROWS},{w},{TINY.vocab_size}]" in text}

  assert head_widths_in(base) == set(head_widths(TINY_BLOCK))
  assert head_widths_in(captured) == {TINY_BLOCK}
  masked, full = (jax.device_get(make_engine(graphdef, cfg, ROWS)(params, prompts, valid, key))
                  for cfg in (base, captured))
  distinct = [q for q in range(Q) if q not in TIED]
  np.testing.assert_array_equal(masked.tokens[distinct], full.tokens[distinct])
  for name in ("nfe", "nfe_engine", "n_generated", "finished"):
    np.testing.assert_array_equal(getattr(masked, name)[distinct], getattr(full, name)[distinct])
