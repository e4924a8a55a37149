"""The serving engine (`decode.per_row.serve_call`, `serve.engine.BlockEngine`): requests
admitted between device calls, each with its own seed, decoder rule, temperature and length,
decode exactly as the offline per-row engine decodes that prompt alone with the request's key,
whatever else runs beside them and in whatever order they arrive; a cancelled request leaves
its row to the next one; rows split over two devices give the same tokens. Every test compares
token ids and forward counts of two programs: all are rerun under other CPU numerics."""
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode import per_row
from orl_jax.decode.config import DecodeConfig
from orl_jax.serve.engine import BlockEngine, EngineShape, Entry
from orl_jax.sharding import make_mesh
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import (TINY, TINY_BLOCK, TINY_RULES, live_adapter,
                                   run_on_4_cpu_devices, tiny_model)

# all of them (`numerics`): token ids and forward counts of the engine against another program
pytestmark = pytest.mark.numerics

P, GEN, ROWS, WAITING = 8, 12, 3, 4
EOS = 5                              # an ordinary token of the random model: rows end early
# (prompt, seed, choice, max_tokens, rule, temperature); seeds above 2**32 use both halves
REQUESTS = [(0, 11, 0, 12, "threshold_0.3", 0.0), (1, 12, 0, 12, "threshold_0.3", 0.8),
            (2, 13, 1, 8, "entropy_budget_0.4", 1.0), (3, 14, 0, 12, "fixed_steps_2", 0.0),
            (4, 15, 0, 5, "threshold_0.5", 0.0), (5, 2**33 + 3, 2, 12, "entropy_budget_0.2", 0.7),
            (6, 7, 0, 12, "threshold_0.3", 0.0)]
ARRIVALS = {0: [0, 1], 1: [2, 3, 4], 3: [5, 6]}     # device call -> requests admitted before it
PAD_LEFT = [0, 3, 6, 4, 0, 1, 2]


def _model(attention):
  model = live_adapter(tiny_model(3, residual_mode="adapter", attention=attention), 0.05, 9)
  return model, *nnx.split(model)


def _prompts():
  tokens = np.asarray(jax.random.randint(jax.random.key(0), (len(PAD_LEFT), P), 3,
                                         TINY.vocab_size))
  return [tokens[q, pad:] for q, pad in enumerate(PAD_LEFT)]


def _cfg(**rules):
  return DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                      rule=UnmaskRule("threshold", 0.3), **{**TINY_RULES, **rules})


def _serve(engine, prompts, requests=REQUESTS, arrivals=ARRIVALS, cancel_at=None, calls=80):
  """Runs the engine call by call, admitting `arrivals`; -> {request: (response blocks,
  forwards, denoising forwards)} of the finished ones; `cancel_at`: (call, request)."""
  free = list(range(engine.shape.slots))
  slot_of, done, waiting = {}, {}, 0
  for call in range(calls):
    entries = []
    for r in arrivals.get(call, []):
      q, seed, choice, n, rule, temperature = requests[r]
      slot_of[r] = free.pop(0)
      entries.append(Entry(slot_of[r], prompts[q], seed, choice, n, UnmaskRule.parse(rule),
                           temperature))
    assert len(entries) <= engine.shape.waiting - waiting, "the test admits past the room"
    cancel = [slot_of[cancel_at[1]]] if cancel_at and cancel_at[0] == call else []
    view = engine.call(entries, cancel)
    waiting = view.waiting
    for r, s in slot_of.items():
      if view.done[s] and r not in done and not (cancel_at and cancel_at[1] == r):
        done[r] = (view.blocks[s].copy(), int(view.nfe[s]), int(view.nfe_denoise[s]))
        free.append(s)
    if len(done) + bool(cancel_at) == sum(map(len, arrivals.values())) and call > max(arrivals):
      return done
  raise AssertionError(f"requests left unfinished: {sorted(set(slot_of) - set(done))}")


def _alone(graphdef, params, cfg, prompt, request, gen_length=GEN):
  """The offline per-row engine decoding the prompt alone with the request's key and setting."""
  _, seed, choice, n, rule, temperature = request
  b = cfg.block_size
  rcfg = dataclasses.replace(cfg, rule=UnmaskRule.parse(rule), temperature=temperature,
                             gen_length=gen_length or -(-n // b) * b)
  key = per_row.request_keys(np.array([seed % 2**32], np.uint32),
                             np.array([seed // 2**32], np.uint32), np.array([choice], np.int32))
  tokens = np.zeros((1, P), np.int32)
  valid = np.zeros((1, P), bool)
  tokens[0, P - len(prompt):], valid[0, P - len(prompt):] = prompt, True
  return jax.device_get(per_row.make_engine(graphdef, rcfg, ROWS)(params, tokens, valid, key))


def _response(blocks, n, lead, eos=EOS, mask=TINY.mask_id):
  """The response the server returns from a slot's blocks (scheduler: cut at n and EOS)."""
  out = np.where(blocks == mask, eos, blocks)[lead:lead + n].copy()
  if (out == eos).any():
    out[np.argmax(out == eos):] = eos
  return out


@pytest.mark.parametrize("attention,rules", [
    ("block_causal", {}),
    ("bidirectional", {}),
    # LLaDA2.1's rules: blocks at absolute positions, strict threshold, every block decoded,
    # token editing
    ("block_causal", dict(block_placement="absolute", commit_compare=">", eos_early_stop=False,
                          edit_threshold=0.2, max_post_edit_steps=2)),
])
def test_each_request_decodes_as_the_offline_engine_decodes_it_alone(attention, rules):
  model, graphdef, params = _model(attention)
  cfg = _cfg(**rules)
  engine = BlockEngine(graphdef, params, model.cfg, cfg, EngineShape(ROWS, WAITING, P, 3),
                       make_mesh(devices=jax.devices()[:1]))
  prompts = _prompts()
  done = _serve(engine, prompts)
  absolute = cfg.block_placement == "absolute"
  for r, (blocks, nfe, denoise) in done.items():
    q, _, _, n, _, _ = REQUESTS[r]
    lead = len(prompts[q]) % TINY_BLOCK if absolute else 0
    # a bidirectional canvas attends to every masked position of the engine's canvas: a
    # shorter max_tokens is the prefix of the engine-length decode
    prefix = attention == "bidirectional" and n < GEN
    ref = _alone(graphdef, params, cfg, prompts[q], REQUESTS[r], GEN if prefix else 0)
    np.testing.assert_array_equal(_response(blocks, n, lead), ref.tokens[0][:n],
                                  err_msg=f"request {r}")
    if not prefix:
      assert (nfe, denoise) == (int(ref.nfe[0]), int(ref.nfe_denoise[0])), r


def test_a_cancelled_request_leaves_its_row_and_the_others_decode_as_alone():
  model, graphdef, params = _model("block_causal")
  cfg = _cfg()
  engine = BlockEngine(graphdef, params, model.cfg, cfg, EngineShape(1, 2, P, 2),
                       make_mesh(devices=jax.devices()[:1]))
  prompts = _prompts()
  arrivals = {0: [0, 1], 1: [6]}     # 0 takes the row, 1 and 6 wait; 0 is cancelled at call 1
  done = _serve(engine, prompts, arrivals=arrivals, cancel_at=(1, 0))
  assert set(done) == {1, 6}
  for r in (1, 6):
    ref = _alone(graphdef, params, cfg, prompts[REQUESTS[r][0]], REQUESTS[r])
    np.testing.assert_array_equal(_response(done[r][0], GEN, 0), ref.tokens[0])
    assert done[r][1:] == (int(ref.nfe[0]), int(ref.nfe_denoise[0]))


def test_new_weights_serve_the_next_requests():
  model, graphdef, params = _model("block_causal")
  other = nnx.split(live_adapter(tiny_model(4, residual_mode="adapter"), 0.05, 9))[1]
  cfg = _cfg()
  engine = BlockEngine(graphdef, params, model.cfg, cfg, EngineShape(ROWS, WAITING, P, 3),
                       make_mesh(devices=jax.devices()[:1]))
  prompts = _prompts()
  engine.set_params(other)
  done = _serve(engine, prompts, arrivals={0: [0, 3]})
  for r in (0, 3):
    ref = _alone(graphdef, other, cfg, prompts[REQUESTS[r][0]], REQUESTS[r])
    np.testing.assert_array_equal(_response(done[r][0], GEN, 0), ref.tokens[0])


_SHARDED = """
import jax, numpy as np
jax.config.update("jax_num_cpu_devices", 4)
from flax import nnx
from orl_jax.serve.engine import BlockEngine, EngineShape
from orl_jax.sharding import make_mesh
from tests.serve import test_serve_engine as t
model, graphdef, params = t._model("block_causal")
cfg = t._cfg()
prompts = t._prompts()
outs = []
for devices in (jax.devices()[:1], jax.devices()[:2]):
  mesh = make_mesh(devices=devices)
  engine = BlockEngine(graphdef, params, model.cfg, cfg, EngineShape(4, 4, t.P, 3), mesh)
  assert len(engine.state.carry.rows.slot.sharding.device_set) == len(devices)
  outs.append(t._serve(engine, prompts))
for r in outs[0]:
  np.testing.assert_array_equal(outs[0][r][0], outs[1][r][0])
  assert outs[0][r][1:] == outs[1][r][1:]
print("SHARDED_OK")
"""


def test_rows_split_over_two_devices_decode_the_same_tokens():
  run_on_4_cpu_devices(_SHARDED, "SHARDED_OK")


# requests of several choices (one prompt and seed, choices 0..n-1) beside lone requests:
# request -> (prompt, seed, choices, max_tokens, rule, temperature)
CHOICE_REQUESTS = [(1, 21, 4, 12, "threshold_0.3", 1.0), (2, 22, 3, 12, "entropy_budget_0.4", 0.8),
                   (1, 23, 2, 8, "threshold_0.5", 1.0)]
CHOICE_ARRIVALS = {0: [("n", 0), ("lone", 0)], 1: [("n", 1), ("lone", 3)], 6: [("n", 2)]}


def test_the_choices_of_a_request_prefill_once_and_answer_as_without():
  """A request's `n` choices admitted in one call share one prompt cache of the prompt pool
  (`EngineShape.pool`, docs/serving.md#the-prompt-pool): one of them prefills it, the others
  copy it; with lone requests beside them and entries reused, every choice answers as with no
  pool (blocks and both forward counts)."""
  model, graphdef, params = _model("block_causal")
  cfg = _cfg()
  prompts = _prompts()
  requests, arrivals = [], {}
  for call, admitted in CHOICE_ARRIVALS.items():
    for kind, i in admitted:
      if kind == "lone":
        arrivals.setdefault(call, []).append(len(requests))
        requests.append(REQUESTS[i])
        continue
      q, seed, n, max_tokens, rule, temperature = CHOICE_REQUESTS[i]
      for choice in range(n):
        arrivals.setdefault(call, []).append(len(requests))
        requests.append((q, seed, choice, max_tokens, rule, temperature))
  mesh = make_mesh(devices=jax.devices()[:1])
  outs, books = [], []
  for pool in (2, 0):
    engine = BlockEngine(graphdef, params, model.cfg, cfg, EngineShape(ROWS, 8, P, 3, pool), mesh)
    outs.append(_serve(engine, prompts, requests, arrivals))
    books.append(engine.pool)
  pooled, plain = outs
  assert set(pooled) == set(plain) == set(range(len(requests)))
  for r in pooled:
    np.testing.assert_array_equal(pooled[r][0], plain[r][0], err_msg=f"request {r}")
    assert pooled[r][1:] == plain[r][1:], r
  # one request of several choices against its prompt decoded alone (the plain engine is
  # checked against it request by request above)
  q = requests[0][0]
  ref = _alone(graphdef, params, cfg, prompts[q], requests[0], 0)
  np.testing.assert_array_equal(_response(pooled[0][0], GEN, 0), ref.tokens[0])
  # one prefill per request of several choices, and the two entries reused by the third
  assert (books[0].fills, books[0].shared) == (3, 9) and books[1].fills == 0
  assert len({tuple(requests[r][:3]) for r in pooled}) == len(requests)
