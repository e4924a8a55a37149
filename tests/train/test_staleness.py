"""One step of lag (docs/training.md#one-step-of-lag): with `orl.max_staleness=1` the next
iteration's rollout is dispatched with the current parameters before this iteration's
verification and update, so each update replays states drawn one update earlier. Each
iteration logs that lag as `staleness`, the jitted step's `policy_lag` equals it, every rollout
is used once; a run killed (between checkpoints, at a stop request, with rollout snapshots and
chunks) resumes to the uninterrupted run's parameters bit for bit, the rollout in flight at the
checkpoint being drawn again from the parameters the checkpoint saved for it."""
import os
import signal
from unittest import mock

import numpy as np
import pytest
from safetensors.numpy import load_file

from orl_jax.config.build import ConfigError, build
from orl_jax.metrics import read_jsonl
from orl_jax.storage.run_settings import ChangedSettingsError
from orl_jax.train import interrupt, orl
from orl_jax.train.entry import train
from tests.support.helpers import orl_smoke_config, resumes_bit_exactly_after_a_crash

STEPS = 4
TIMES = ("sec_rollout", "sec_verify_exposed", "sec_verify_host", "sec_plan", "sec_gather",
         "sec_update", "sec_checkpoint", "sec_iteration", "device_busy")


def _config(workdir, staleness: int, steps: int = STEPS):
  c = orl_smoke_config(workdir, steps=steps)   # every response trains; checkpoints every 2
  c.orl.max_staleness = staleness
  return c


def _params(folder) -> dict:
  return load_file(os.path.join(folder, "params.safetensors"))


def _same_params(a: dict, b: dict) -> None:
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{staleness: (params folder, metrics rows)} of uninterrupted runs."""
  root = tmp_path_factory.mktemp("staleness")
  out = {}
  for lag in (0, 1):
    folder = train(_config(root / f"lag{lag}", lag), progress=False)
    out[lag] = folder, read_jsonl(str(root / f"lag{lag}" / "metrics.jsonl"))
  return out


def test_each_update_replays_a_rollout_one_update_old(runs):
  _, rows = runs[1]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  # the first iteration has nothing in flight: it rolls out with the current parameters
  assert [r["staleness"] for r in rows] == [0, 1, 1, 1]
  assert [r["policy_lag"] for r in rows] == [r["staleness"] for r in rows]
  assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]
  assert all(r["rollout_uses"] == 1 for r in rows)
  assert [r["updates"] for r in rows] == [1, 2, 3, 4]


def test_staleness_0_is_the_on_policy_loop_and_the_lag_changes_the_run(runs):
  (on_folder, on_rows), (lag_folder, lag_rows) = runs[0], runs[1]
  assert all("staleness" not in r and r["policy_lag"] == 0 for r in on_rows)
  strip = lambda r: {k: v for k, v in r.items() if k not in TIMES + ("staleness", "policy_lag")}
  # iteration 0 is the same rollout and update in both; the first update is taken at learning
  # rate 0 (the warm-up's first step), so iteration 1's rollouts agree too; iteration 2's, drawn
  # with the parameters of update 1 instead of 2, do not
  assert strip(on_rows[0]) == strip(lag_rows[0]) and strip(on_rows[1]) == strip(lag_rows[1])
  assert on_rows[2]["loss"] != lag_rows[2]["loss"]
  on, lag = _params(on_folder), _params(lag_folder)
  assert any(not np.array_equal(on[k], lag[k]) for k in on)


def test_killed_between_checkpoints_it_resumes_the_rollout_in_flight(runs, tmp_path):
  """Killed in iteration 3 (before its update): the newest checkpoint, 2, was saved while
  iteration 2's rollout was in flight, drawn with the parameters of update 1; the resume draws
  it again from the parameters the checkpoint saved, and logs its lag."""
  rows = resumes_bit_exactly_after_a_crash(lambda w: _config(w, 1), tmp_path, 3,
                                           straight=runs[1][0])
  assert [(r["step"], r["staleness"], r["policy_lag"]) for r in rows] == [
      (1, 0, 0), (2, 1, 1), (3, 1, 1), (4, 1, 1)]


@pytest.mark.slow  # ~32 s: the kill-and-resume case stays in the default run
def test_a_stop_request_saves_the_rollout_in_flight(runs, tmp_path):
  """SIGTERM during iteration 1 (no periodic checkpoint: `checkpoint.every=0`): the stop at the
  next boundary saves checkpoint 2 with the rollout in flight; the rerun resumes exactly."""
  config = _config(tmp_path / "w", 1)
  config.checkpoint.every = 0
  snapshot = orl.snapshot

  def stop_during(steps, it, rolled):
    if it == 1:
      interrupt.request(signal.SIGTERM)
    return snapshot(steps, it, rolled)

  try:
    with mock.patch.object(orl, "snapshot", stop_during), \
        pytest.raises(interrupt.Interrupted) as e:
      train(config, progress=False)
  finally:
    interrupt.clear()
  assert (e.value.step, e.value.saved) == (2, True)
  assert os.path.isdir(tmp_path / "w" / "checkpoints" / "2" / "extra")
  _same_params(_params(runs[1][0]), _params(train(config, progress=False)))
  rows = read_jsonl(str(tmp_path / "w" / "metrics.jsonl"))
  assert [r["staleness"] for r in rows] == [0, 1, 1, 1]


@pytest.mark.slow  # ~43 s: the kill-and-resume case stays in the default run
def test_snapshots_and_chunks_resume_exactly_with_a_lag(tmp_path):
  """Rollout snapshots and two chunks verified while the next decodes: killed between the
  rollout and the update of iteration 2, the resume takes that rollout from its snapshot."""
  def cfg(workdir):
    c = _config(workdir, 1, steps=3)
    c.checkpoint.every, c.checkpoint.save_rollouts = 1, True
    c.orl.rollout_chunks, c.orl.chunk_by, c.orl.verify_while_decoding = 2, "prompts", True
    return c

  rows = resumes_bit_exactly_after_a_crash(cfg, tmp_path, 2)
  assert [(r["step"], r["rollout_from_snapshot"], r["staleness"], r["policy_lag"])
          for r in rows] == [(1, 0.0, 0, 0), (2, 0.0, 1, 1), (3, 1.0, 1, 1)]


@pytest.mark.slow  # ~32 s: the kill-and-resume case stays in the default run
def test_a_resume_under_another_staleness_is_refused_unless_allowed(tmp_path, caplog):
  """The setting is recorded: a run checkpointed on-policy resumes with a lag only when
  `checkpoint.allow_changed` names it, and then starts with nothing in flight (lag 0)."""
  train(_config(tmp_path, 0), progress=False, stop_after=2)
  with pytest.raises(ChangedSettingsError, match=r"orl.max_staleness: 0 -> 1"):
    train(_config(tmp_path, 1), progress=False)
  lagged = _config(tmp_path, 1)
  lagged.checkpoint.allow_changed = "orl.max_staleness"
  train(lagged, progress=False)
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r.get("staleness")) for r in rows] == [(1, None), (2, None), (3, 0),
                                                             (4, 1)]


def test_max_staleness_is_0_or_1():
  c = orl_smoke_config("unused")
  c.orl.max_staleness = 2
  with pytest.raises(ConfigError, match=r"orl.max_staleness=2 must be 0 \(on-policy\) or 1"):
    build(c)


def test_lagged_iterations_move_data_only_at_their_named_host_hops(tmp_path):
  """Two lagged iterations under `jax.transfer_guard("disallow")`: the parameter copy and the
  rollout dispatched ahead make no host transfer of their own."""
  import jax
  from orl_jax.setup.build import build_setup
  from orl_jax.train.run import prepare_run
  s = build_setup(_config(tmp_path, 1))
  r = prepare_run(s)
  steps = orl.build_orl_steps(s, r, orl.prompt_stream(s))
  with jax.transfer_guard("disallow"):
    state, first = orl.lagged_iteration(steps, r.state, 0)
    state, second = orl.lagged_iteration(steps, state, 1)
  assert (first.staleness, second.staleness) == (0, 1)
  assert steps.ahead is not None and steps.ahead.it == 2
  with jax.transfer_guard("allow"):
    assert int(state.step) == 2 and int(second.metrics["policy_lag"]) == 1
  steps.close()
  r.ckpt.close()
