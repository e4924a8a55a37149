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

from configs import tiny
from orl_jax.storage.checkpoint import Checkpointer, abstract_like
from orl_jax.storage.run_settings import ChangedSettingsError
from orl_jax.setup.build import build_setup
from orl_jax.train.run import prepare_run, resume
from orl_jax.config import sections
from orl_jax.setup import recorded
from orl_jax.setup.recorded import recorded_settings as run_settings
from tests.support.helpers import orl_smoke_config

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


# ------------------------------------------------------------------ the table of a real run


def _smoke(workdir):
  c = tiny.get_config("smoke")
  c.workdir = str(workdir)
  c.train.warmup_steps = 1
  return c


def test_steps_logging_checkpointing_and_workdir_may_differ(tmp_path):
  a, b = orl_smoke_config(tmp_path / "a"), orl_smoke_config(tmp_path / "b")
  b.train.steps, b.train.log_every, b.train.lr, b.train.batch_size = 9, 1, 1e-4, 4
  b.checkpoint.every, b.checkpoint.keep, b.eval.n_problems = 1, 5, 4
  assert run_settings(build_setup(a)) == run_settings(build_setup(b))


def test_the_table_holds_resolved_values(tmp_path):
  setup = build_setup(orl_smoke_config(tmp_path))
  settings, tok = run_settings(setup), setup.tokenizer
  assert settings["decode.block_placement"] == "prompt_end"        # "auto" resolved: ours
  assert settings["decode.commit_compare"] == ">="
  assert settings["model.special_tokens.mask"] == tok.mask_id
  assert settings["model.special_tokens.eos"] == [tok.eos_id]
  assert settings["orl.rollout_rule_value"] == 0.9 and settings["loss.w_aec"] == 1.0
  json.dumps(settings)                                                # all JSON


def test_the_table_is_what_the_sections_mark_recorded(tmp_path, monkeypatch):
  """The recorded fields come from the sections (`sections.recorded`), plus the vocabulary's
  hash; a resolved value for a field no section marks is refused, not silently recorded."""
  setup = build_setup(orl_smoke_config(tmp_path))
  marked = sections.recorded_fields(setup.config)
  assert set(run_settings(setup)) == set(marked) | {"tokenizer.vocab_hash"}
  assert "orl.group_size" in marked and "train.steps" not in marked
  unmarked = {k: v for k, v in marked.items() if k != "model.vocab_size"}
  monkeypatch.setattr(recorded, "recorded_fields", lambda config: dict(unmarked))
  with pytest.raises(ValueError, match="model.vocab_size"):
    run_settings(setup)


def test_an_sft_run_records_no_orl_settings(tmp_path):
  settings = run_settings(build_setup(_smoke(tmp_path)))
  assert "decode.block_size" in settings and settings["train.mode"] == "sft"
  assert not [k for k in settings if k.split(".")[0] in ("orl", "replay", "loss")]


def _resume_run(config):
  run = prepare_run(build_setup(config))
  try:
    return resume(run, None)[1]
  finally:
    run.ckpt.close()


def _orl(workdir):
  c = orl_smoke_config(workdir)
  c.loss.w_kl = 0.0              # no frozen reference copy: a smaller state to build
  return c


def test_a_run_resumed_under_changed_settings_stops_until_the_change_is_accepted(tmp_path):
  run = prepare_run(build_setup(_orl(tmp_path)))
  run.ckpt.save(3, run.state)                  # what the loops save
  run.ckpt.close()
  assert _resume_run(_orl(tmp_path)) == 3
  changed = _orl(tmp_path)
  changed.train.steps, changed.train.log_every = 9, 1                 # free to differ
  changed.orl.rollout_rule_value, changed.loss.w_aec = 0.7, 0.5
  with pytest.raises(ChangedSettingsError) as e:
    _resume_run(changed)
  msg = str(e.value)
  assert ("  orl.rollout_rule_value: 0.9 -> 0.7\n  loss.w_aec: 1.0 -> 0.5\n" in msg
          and f"add\n  {FLAG}\nor start" in msg), msg
  changed.checkpoint.allow_changed = FLAG.split("=", 1)[1]
  assert _resume_run(changed) == 3


def test_allow_changed_must_name_recorded_settings(tmp_path):
  c = orl_smoke_config(tmp_path)
  c.checkpoint.allow_changed = "orl.rollout_rule_value,decode.threshold"
  with pytest.raises(ChangedSettingsError, match="names decode.threshold, which a checkpoint"):
    prepare_run(build_setup(c))
