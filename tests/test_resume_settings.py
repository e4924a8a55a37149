"""Resume knows what it resumes: each checkpoint records the run's settings (the model and
tokenizer, special ids, block rules, the rollout's decoder, capture, replay and loss), and a
resume under other values stops naming each field, unless `checkpoint.allow_changed` accepts
it. Checkpoints written before settings were recorded resume with one warning."""
import json
import logging
import os

import grain
import jax.numpy as jnp
import numpy as np
import pytest

from orl_jax.checkpoint import Checkpointer, abstract_like
from orl_jax.run_settings import ChangedSettingsError

SETTINGS = {"decode.block_size": 8, "orl.rollout_rule_value": 0.9, "loss.w_aec": 1.0,
            "model.special_tokens.eos": (3, 7)}
CHANGED = dict(SETTINGS, **{"orl.rollout_rule_value": 0.7, "loss.w_aec": 0.5})
FLAG = "--config.checkpoint.allow_changed=orl.rollout_rule_value,loss.w_aec"


def _state(step):
  return {"w": jnp.full((4, 4), float(step)), "step": jnp.int32(step)}


def _data_iter():
  return iter(grain.MapDataset.range(100).batch(2))


def _checkpoint_at_step_2(directory, settings):
  ckpt = Checkpointer(str(directory), every=1, keep=2, settings=settings)
  it = _data_iter()
  for step in (1, 2):
    next(it)
    ckpt.save(step, _state(step), it)
  ckpt.close()


def _resume(directory, settings, allow=()):
  ckpt = Checkpointer(str(directory), every=1, keep=2, settings=settings, allow_changed=allow)
  it = _data_iter()
  try:
    step, state, _ = ckpt.restore_latest(abstract_like(_state(0)), it)
  finally:
    ckpt.close()
  return step, state, it


def _warnings(caplog):
  return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_settings_are_readable_json_in_the_step_metadata(tmp_path):
  _checkpoint_at_step_2(tmp_path, SETTINGS)
  with open(tmp_path / "2" / "_CHECKPOINT_METADATA") as f:
    recorded = json.load(f)["custom_metadata"]["run_settings"]
  assert recorded == dict(SETTINGS, **{"model.special_tokens.eos": [3, 7]})


def test_same_settings_resume_silently(tmp_path, caplog):
  _checkpoint_at_step_2(tmp_path, SETTINGS)
  with caplog.at_level(logging.WARNING):
    step, state, it = _resume(tmp_path, SETTINGS)
  assert step == 2 and int(state["step"]) == 2 and next(it).tolist() == [4, 5]
  assert _warnings(caplog) == []


def test_changed_settings_stop_the_resume_naming_each_field_and_the_flag(tmp_path):
  _checkpoint_at_step_2(tmp_path, SETTINGS)
  with pytest.raises(ChangedSettingsError) as e:
    _resume(tmp_path, CHANGED)
  msg = str(e.value)
  assert f"checkpoint step 2 in {tmp_path}" in msg
  assert "  orl.rollout_rule_value: 0.9 -> 0.7\n" in msg
  assert "  loss.w_aec: 1.0 -> 0.5\n" in msg
  assert "decode.block_size" not in msg
  assert f"add\n  {FLAG}\nor start" in msg
  assert sorted(os.listdir(tmp_path)) == ["1", "2"]          # nothing moved aside


def test_accepted_changes_resume_with_one_warning_naming_them(tmp_path, caplog):
  _checkpoint_at_step_2(tmp_path, SETTINGS)
  with caplog.at_level(logging.WARNING):
    step, _, _ = _resume(tmp_path, CHANGED, allow=("orl.rollout_rule_value", "loss.w_aec"))
  assert step == 2
  (warning,) = _warnings(caplog)
  assert "orl.rollout_rule_value: 0.9 -> 0.7" in warning and "loss.w_aec: 1.0 -> 0.5" in warning


def test_a_partly_accepted_change_prints_the_flag_with_every_field(tmp_path):
  _checkpoint_at_step_2(tmp_path, SETTINGS)
  with pytest.raises(ChangedSettingsError) as e:
    _resume(tmp_path, CHANGED, allow=("orl.rollout_rule_value",))
  msg = str(e.value)
  assert "loss.w_aec: 1.0 -> 0.5" in msg and "rollout_rule_value: 0.9" not in msg
  assert f"add\n  {FLAG}\nor start" in msg


def test_a_checkpoint_without_settings_resumes_with_one_warning(tmp_path, caplog):
  _checkpoint_at_step_2(tmp_path, None)           # as checkpoints were written before
  with caplog.at_level(logging.WARNING):
    step, state, _ = _resume(tmp_path, CHANGED)
  assert step == 2
  np.testing.assert_array_equal(np.asarray(state["w"]), np.full((4, 4), 2.0))
  (warning,) = _warnings(caplog)
  assert "records no run settings" in warning and "checkpoint step 2" in warning
