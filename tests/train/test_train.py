import dataclasses
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import tiny
from orl_jax.config.build import ConfigError, build
from orl_jax.metrics import read_jsonl
from orl_jax.models import params_io
from orl_jax.storage import machine as machine_lib
from orl_jax.train import entry
from orl_jax.train.entry import train
from orl_jax.setup.build import build_setup
from orl_jax.train.run import prepare_run, resume
from tests.support.helpers import (CHECKPOINT_FILE_KINDS, orl_smoke_config, tensorboard_scalars,
                           truncate_half)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _smoke(workdir, **train):
  c = tiny.get_config("smoke")
  c.workdir = str(workdir)
  for k, v in train.items():
    c.train[k] = v
  return c


def test_validate_names_the_fields():
  c = tiny.get_config("smoke")
  c.decode.gen_length = 30
  c.task.prompt_len = 20
  c.model.n_kv_heads = 3
  c.eval.settings = ("threshold_0.9", "beam_4")
  with pytest.raises(ConfigError) as e:
    build(c)
  msg = str(e.value)
  for field in ("decode.gen_length", "task.prompt_len", "model.n_kv_heads", "eval.settings"):
    assert field in msg


def test_exact_resume_is_bit_identical(tmp_path, caplog):
  """Killed after step 3 with checkpoints at steps 2 and 3, and step 3's array data damaged
  afterwards: the run resumes from step 2 and ends bit-identical to an uninterrupted one."""
  straight = train(_smoke(tmp_path / "a", steps=4), progress=False)
  killed = _smoke(tmp_path / "b", steps=4)
  killed.checkpoint.every = 1
  train(killed, progress=False, stop_after=3)                      # "killed" at step 3
  truncate_half(CHECKPOINT_FILE_KINDS["array data"](tmp_path / "b" / "checkpoints" / "3"))
  before = read_jsonl(str(tmp_path / "b" / "metrics.jsonl"))
  assert [r["step"] for r in before] == [2, 3]                          # log_every=2, and the last
  with caplog.at_level(logging.WARNING):
    resumed = train(killed, progress=False)
  warnings = [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]
  assert len(warnings) == 1 and "step 3" in warnings[0] and "resuming from step 2" in warnings[0]
  assert os.path.isdir(tmp_path / "b" / "checkpoints-corrupt" / "3")   # moved aside, kept
  a = load_file(os.path.join(straight, "params.safetensors"))
  b = load_file(os.path.join(resumed, "params.safetensors"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # the export records where it was trained (what decides its last bits)
  assert params_io.read_meta(straight)["machine"] == machine_lib.machine()
  # each step logged once: step 2's row is the killed run's, its step 3 row was dropped
  after = read_jsonl(str(tmp_path / "b" / "metrics.jsonl"))
  assert [r["step"] for r in after] == [2, 4] and after[0] == before[0]
  assert tensorboard_scalars(str(tmp_path / "b" / "tensorboard" / "metrics"), "loss") == [2, 4]


_SHARDED = textwrap.dedent("""
  import dataclasses
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import numpy as np
  from configs import tiny
  from orl_jax import sharding
  from orl_jax.data.pipeline import train_dataset
  from orl_jax.losses import sft_loss
  from orl_jax.setup.build import build_setup
  from orl_jax.config import derive as config_lib
  from orl_jax.train.state import create_train_state, make_train_step
  from orl_jax.optimizer import optimizer_of
  assert len(jax.devices()) == 4
  c = tiny.get_config("smoke")
  c.train.batch_size = 8
  s = build_setup(c)
  batch = next(iter(train_dataset(s.task.train_problem, s.tokenizer, prompt_len=32,
                                  gen_length=32, batch_size=8)))
  losses = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = sharding.make_mesh(devices=devices)
    opt = optimizer_of(dataclasses.replace(config_lib.optimizer_config(s.config),
                                           residual_lr_scale=0.1), s.model_cfg)
    g, state, sh = create_train_state(s.model_cfg, opt, mesh, 0)
    fn = lambda m, b, k: sft_loss(m, b, k, block_size=8, mask_id=s.model_cfg.mask_id)
    step = make_train_step(g, opt, fn, mesh, sh)
    sharded = sharding.shard_batch(batch, mesh)
    assert len(sharded.response.sharding.device_set) == len(devices)
    for _ in range(2):
      state, m = step(state, sharded, jax.random.key(0))
    losses.append(float(m["loss"]))
  print("LOSSES", losses)
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
""")


def test_one_and_four_devices_give_the_same_loss():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", _SHARDED], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "LOSSES" in out.stdout


def test_orl_is_on_policy_and_resumes_exactly(tmp_path, capsys):
  import json
  straight = train(orl_smoke_config(tmp_path / "a"), progress=False)
  # killed after step 3 (logged) with the last checkpoint at step 2
  train(orl_smoke_config(tmp_path / "b"), progress=False, stop_after=3)
  assert "resumed" not in capsys.readouterr().out
  newest = max(int(d) for d in os.listdir(tmp_path / "b" / "checkpoints") if d.isdigit())
  resumed = train(orl_smoke_config(tmp_path / "b"), progress=False)
  assert (f"resumed from step {newest} ({tmp_path / 'b' / 'checkpoints'})"
          in capsys.readouterr().out)
  a = load_file(os.path.join(straight, "params.safetensors"))
  b = load_file(os.path.join(resumed, "params.safetensors"))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert [r["step"] for r in read_jsonl(str(tmp_path / "b" / "metrics.jsonl"))] == [1, 2, 3, 4]
  with open(tmp_path / "a" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  # every update consumed a fresh rollout drawn with the parameters of that very step
  assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]
  assert all(r["rollout_uses"] == 1 and r["policy_lag"] == 0 for r in rows)
  assert all(r["states_packed"] > 0 for r in rows)


def test_an_orl_iteration_moves_data_only_at_its_named_host_hops(tmp_path, monkeypatch):
  """rollout -> verify -> plan -> gather -> update under `jax.transfer_guard("disallow")`:
  only the named hops (prompts, verification, planning, logging, checkpoints) reach the host."""
  import contextlib
  import jax
  from orl_jax.train import orl
  s = build_setup(orl_smoke_config(tmp_path, steps=2))
  r = prepare_run(s)
  steps = orl.build_orl_steps(s, r, orl.prompt_stream(s))
  from orl_jax.data import tiny_task
  calls, train_problem = [], tiny_task.train_problem
  monkeypatch.setattr(tiny_task, "train_problem",
                      lambda i, cfg: calls.append(i) or train_problem(i, cfg))
  with jax.transfer_guard("disallow"):
    state, record = orl.orl_iteration(steps, r.state, 0)
  assert record.verified.all() and record.plan_stats["states_packed"] > 0
  # each prompt's problem is read once: for the prompt, then reused to verify its G responses
  assert sorted(calls) == sorted(int(i) for i in record.summary.prompt_ids)
  with jax.transfer_guard("allow"):
    assert int(state.step) == 1 and int(record.metrics["policy_lag"]) == 0
  # the guard is live: without the hops the same iteration stops at its first host transfer
  monkeypatch.setattr(orl, "host_hop", lambda name: contextlib.nullcontext())
  with jax.transfer_guard("disallow"), pytest.raises(Exception, match="Disallowed"):
    orl.orl_iteration(steps, state, 1)
  r.ckpt.close()


def test_ledger_refuses_reuse():
  from orl_jax.train.orl import RolloutLedger
  ledger = RolloutLedger()
  ledger.consume(0)
  ledger.consume(1)
  with pytest.raises(RuntimeError, match="already used"):
    ledger.consume(1)


def test_rcd_offline_trains_from_a_frozen_reference(tmp_path):
  base = train(_smoke(tmp_path / "base", steps=2, warmup_steps=1), progress=False)
  c = _smoke(tmp_path / "rcd", steps=2, warmup_steps=1)
  c.update(c.demo.stages.rcd_offline.to_dict())
  c.train.steps, c.train.warmup_steps = 2, 1
  c.model.init_from = base
  out = train(c, progress=False)
  trained = load_file(os.path.join(out, "params.safetensors"))
  ref = load_file(os.path.join(base, "params.safetensors"))
  moved = max(float(np.abs(trained[k] - ref[k]).max()) for k in ref)
  assert moved > 0.01 * c.train.lr      # the model moved (Adam's steps are ~lr, rounding ~1e-8)
  c.model.residual.mode = "none"         # ... and needs rcd mode
  with pytest.raises(ValueError, match="rcd"):
    train(c, progress=False)


def test_orl_killed_between_rollout_and_update_resumes_from_the_snapshot(tmp_path):
  from tests.support.helpers import resumes_bit_exactly_after_a_crash

  def cfg(workdir):
    c = orl_smoke_config(workdir, steps=3)
    c.checkpoint.every = 1
    c.checkpoint.save_rollouts = True
    return c

  rows = resumes_bit_exactly_after_a_crash(cfg, tmp_path, 2)
  assert [(r["step"], r["rollout_from_snapshot"]) for r in rows] == [(1, 0.0), (2, 0.0), (3, 1.0)]


_SHARDED_REPLAY = textwrap.dedent("""
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import numpy as np
  from flax import nnx
  from orl_jax import sharding
  from orl_jax.decode.config import DecodeConfig
  from orl_jax.config.sections import Loss
  from orl_jax.losses import LossConfig, orl_loss
  from orl_jax.decode.capture import masked_positions
  from orl_jax.replay import ReplayConfig, build_plan, gather_batch
  from orl_jax.decode.trajectories import make_trajectories
  from orl_jax.unmasking import UnmaskRule
  from tests.support.helpers import TINY, TINY_RULES, tiny_model
  model = tiny_model(7, residual_mode="adapter")
  graphdef, params = nnx.split(model)
  cfg = DecodeConfig(gen_length=8, block_size=4, mask_id=TINY.mask_id, eos_id=2,
                     rule=UnmaskRule("threshold", 0.2), temperature=1.0, capture_states=8,
                     **TINY_RULES)
  prompts = jax.random.randint(jax.random.key(0), (2, 8), 3, TINY.vocab_size)
  valid = np.ones((2, 8), bool)
  traj = make_trajectories(graphdef, cfg, 3)(params, prompts, valid, jax.random.key(5), 0)
  cap = jax.device_get(traj.capture)
  # the KL anchor's frozen reference: a model the policy has moved away from
  reference = jax.tree.map(lambda x: x * 1.05 + 0.01, params)
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = sharding.make_mesh(devices=devices)
    plan, stats = build_plan(prompt_valid=valid, capture_valid=cap.valid, capture_block=cap.block,
                             eligible=np.ones(6, bool), group_size=3,
                             cfg=ReplayConfig(row_len=48, n_rows=8, max_states=48,
                                              max_responses=6, block_size=4,
                                              states_per_response=0, layout="packed",
                                              micro_batches=1, n_shards=len(devices)),
                             rng=np.random.default_rng(0))
    assert stats["states_dropped"] == 0
    batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
    rows, repl = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    batch = jax.device_put(batch, jax.tree.map(lambda x: rows if x.ndim >= 2 else repl, batch))
    assert len(batch.tokens.sharding.device_set) == len(devices)
    fn = jax.jit(jax.value_and_grad(lambda p: orl_loss(
        nnx.merge(graphdef, p), batch,
        LossConfig.from_section(Loss(gate_entropy=0.0, conf_entropy=0.99)),
        reference=nnx.merge(graphdef, reference))[0]))
    loss, grads = fn(params)
    results.append((float(loss), jax.tree.leaves(jax.device_get(grads))))
  print("LOSSES", results[0][0], results[1][0])
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
  for a, b in zip(results[0][1], results[1][1]):   # to rounding of each leaf's magnitude
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(np.abs(a).max(), 1e-30))
  # gradient accumulation: 2 row micro-batches on each of the 4 shards
  from orl_jax.losses import OrlObjective
  from orl_jax.train.state import loss_and_grads
  plan, _ = build_plan(prompt_valid=valid, capture_valid=cap.valid, capture_block=cap.block,
                       eligible=np.ones(6, bool), group_size=3,
                       cfg=ReplayConfig(row_len=48, n_rows=8, max_states=48, max_responses=6,
                                        block_size=4, states_per_response=0,
                                        layout="packed", n_shards=4, micro_batches=2),
                       rng=np.random.default_rng(0))
  batch = jax.device_put(
      gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions),
      jax.tree.map(lambda x: rows if x.ndim >= 2 else repl, batch))
  objective = OrlObjective(LossConfig.from_section(Loss(gate_entropy=0.0, conf_entropy=0.99)))
  (loss, _), grads = loss_and_grads(graphdef, objective, params, batch, jax.random.key(0),
                                    micro_batches=2, n_shards=4, reference=reference)
  np.testing.assert_allclose(float(loss), results[0][0], rtol=1e-5)
  for a, b in zip(results[0][1], jax.tree.leaves(jax.device_get(grads))):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(np.abs(a).max(), 1e-30))
""")


@pytest.mark.numerics   # token ids of one program against another sharding of it
def test_replay_loss_and_grads_agree_on_one_and_four_devices():
  """Cost-balanced rows on 4 data shards give the 1-device loss and gradients (the loss is
  normalised per response across shards)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", _SHARDED_REPLAY], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "LOSSES" in out.stdout


_SHARDED_ROLLOUT = textwrap.dedent("""
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import numpy as np
  from flax import nnx
  from orl_jax import sharding
  from orl_jax.decode.config import DecodeConfig
  from orl_jax.decode.trajectories import make_trajectories
  from orl_jax.unmasking import UnmaskRule
  from tests.support.helpers import TINY, TINY_RULES, tiny_model
  graphdef, params = nnx.split(tiny_model(3, residual_mode="adapter"))
  cfg = DecodeConfig(gen_length=8, block_size=4, mask_id=TINY.mask_id, eos_id=2,
                     rule=UnmaskRule("threshold", 0.3), temperature=1.0, capture_states=8,
                     **TINY_RULES)
  prompts = np.asarray(jax.random.randint(jax.random.key(0), (4, 8), 3, TINY.vocab_size))
  valid = np.ones((4, 8), bool)
  mesh = sharding.make_mesh()
  single = make_trajectories(graphdef, cfg, 2)(params, prompts, valid, jax.random.key(1), 0)
  parallel = make_trajectories(graphdef, cfg, 2, mesh)(params, prompts, valid, jax.random.key(1), 0)
  assert len(parallel.responses.sharding.device_set) == 4, parallel.responses.sharding
  single, parallel = jax.device_get(single), jax.device_get(parallel)
  # sampled tokens, commits and counters: identical; floats: to rounding of their magnitude
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(single), jax.tree.leaves(parallel)):
    name = jax.tree_util.keystr(path)
    if "topk_ids" in name:
      continue
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
      scale = max(np.abs(a).max(initial=0), 1e-30)
      np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0, err_msg=name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=name)
  # top-K ids: equal wherever the rank is not a near tie (two log-probs within rounding may
  # come out in either order on another device count)
  lp = single.capture.topk_logprobs
  gap = np.abs(np.diff(lp, axis=-1))
  tie = np.zeros(lp.shape, bool)
  near = gap <= 1e-4 * np.maximum(np.abs(lp[..., 1:]), 1.0)
  tie[..., 1:] |= near
  tie[..., :-1] |= near
  ids_a, ids_b = single.capture.topk_ids, parallel.capture.topk_ids
  assert (ids_a == ids_b)[~tie].all()
  valid = np.broadcast_to(single.capture.valid[..., None, None], tie.shape)
  assert (~tie)[valid].mean() > 0.9      # the check covers almost every captured rank
  print("SAME")
""")


@pytest.mark.numerics   # token ids of one program against another sharding of it
def test_data_parallel_rollout_equals_single_device():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", _SHARDED_ROLLOUT], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "SAME" in out.stdout


class _EveryOtherResponse:
  """A verifier that passes rollout rows 0, 2, 4, ... of each batch (or none)."""

  def __init__(self, none=False):
    self.none = none

  def score_batch(self, problems, responses):
    return [0.0 if self.none or i % 2 else 1.0 for i in range(len(responses))]


def _orl_with_verifier(monkeypatch, workdir, verifier, steps):
  """An ORL smoke run whose task scores with `verifier`; returns (params dir, [(eligible,
  plan)] of every iteration that built a replay plan)."""
  from orl_jax.train import orl
  plans = []
  real_build, real_setup = orl.build_plan, build_setup

  def build_plan(**kw):
    plan, stats = real_build(**kw)
    plans.append((np.asarray(kw["eligible"]), plan))
    return plan, stats

  def setup_with_verifier(config):
    s = real_setup(config)
    s.task = dataclasses.replace(s.task, verifier=verifier)
    return s

  monkeypatch.setattr(orl, "build_plan", build_plan)
  monkeypatch.setattr(entry, "build_setup", setup_with_verifier)
  c = orl_smoke_config(workdir, steps=steps)
  c.orl.min_reward = 1.0
  return train(c, progress=False), plans


def test_orl_trains_only_on_verified_responses(tmp_path, monkeypatch):
  from orl_jax.replay import SRC_CLEAN, SRC_STATE
  _, plans = _orl_with_verifier(monkeypatch, tmp_path, _EveryOtherResponse(), steps=2)
  assert len(plans) == 2
  for eligible, plan in plans:
    assert eligible.any() and not eligible.all()
    src = np.asarray(plan.src_type)
    for kind in (SRC_STATE, SRC_CLEAN):
      used = set(np.asarray(plan.src_resp)[src == kind].tolist())
      assert used and all(eligible[r] for r in used), (kind, used)


def test_orl_iteration_without_verified_responses_takes_no_step(tmp_path, monkeypatch):
  import json
  from orl_jax.models import params_io
  out, plans = _orl_with_verifier(monkeypatch, tmp_path, _EveryOtherResponse(none=True),
                                  steps=3)
  assert plans == []
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["updates_skipped"] for r in rows] == [1, 2, 3]
  assert all(r["updates"] == 0 and "loss" not in r for r in rows)
  assert params_io.read_meta(out)["train_steps"] == 3
  # no update: the checkpointed state holds the starting parameters and untouched moments
  import jax
  c = orl_smoke_config(tmp_path, steps=3)
  c.orl.min_reward = 1.0                   # the run's own settings (its checkpoint records them)
  run = prepare_run(build_setup(c))
  fresh = jax.device_get(run.state)
  state, at = resume(run, None)
  run.ckpt.close()
  assert at == 3 and int(state.step) == 0
  for a, b in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(fresh)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert all(float(np.abs(np.asarray(x)).max(initial=0)) == 0
             for x in jax.tree.leaves(state.opt_state) if np.asarray(x).dtype.kind == "f")
