"""The typed run config (orl_jax/config/sections.py, orl_jax/config/build.py): every shipped config
converts without losing or changing a value, what a config leaves out takes the one default,
unknown fields and wrong types are named together, a family's own settings join the sections,
and `build` resolves the decode defaults once, leaving the command line's config untouched."""
from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle

import pytest

from configs import diffusion_gemma as dg_configs
from configs import llada, qwendlm, sdar, tiny
from orl_jax.config import build as run_config
from orl_jax.config.sections import ConfigError, RunConfig, Section
from orl_jax.models.diffusion_gemma.family import ArchitectureSettings
from orl_jax.models.diffusion_gemma.sampler import SamplerSettings

VARIANTS = [(tiny, v) for v in ("demo", "sft", "eval", "smoke", "ablations", "orl", "warmup")] + [
    (llada, v) for v in llada.VARIANTS] + [(sdar, v) for v in ("4b", "8b", "debug")] + [
    (qwendlm, None), (qwendlm, "debug"), (dg_configs, "26b-a4b"), (dg_configs, "debug")]


def _same(given: dict, typed: dict, path: str = "") -> list[str]:
  """The fields of `given` (a ConfigDict's dict) whose value `typed` does not hold."""
  out = []
  for k, v in given.items():
    if isinstance(v, dict) and k not in ("stages", "stage_start", "tiny"):
      out += _same(v, typed[k], f"{path}{k}.")
    elif (tuple(v) if isinstance(v, list) else v) != typed[k]:
      out.append(f"{path}{k}: {v!r} -> {typed[k]!r}")
  return out


@pytest.mark.parametrize("module,variant", VARIANTS,
                         ids=[f"{m.__name__.split('.')[-1]}:{v}" for m, v in VARIANTS])
def test_every_shipped_config_converts_value_for_value(module, variant):
  config = module.get_config(variant)
  run = run_config.convert(config)
  assert _same(config.to_dict(), run.to_dict()) == []
  assert run.decode.block_size == config.decode.block_size


def test_what_a_config_leaves_out_takes_the_sections_default():
  """The tiny config has no real-model fields (configs/dlm_common.py adds them): each reads as
  its default, which is what the code read with `.get(name, default)` before."""
  config = tiny.get_config("smoke")
  assert "hf_family" not in config.model and "moe" not in config.model
  run = run_config.convert(config)
  m = run.model
  assert (m.hf_family, m.vocab_size, m.tokenizer, m.first_k_dense, m.norm_head) == ("", 0, "",
                                                                                    0, False)
  assert (m.moe.n_experts, m.moe.impl, m.moe.exchange, m.special_tokens.mask) == (0, "dense",
                                                                                  "auto", "")
  assert (run.task.path, run.task.chat, run.mesh.expert, run.loss.vocab_chunk) == ("", "none",
                                                                                  1, 0)


def test_the_demos_settings_are_its_own_section():
  """The demo pipeline's settings sit in `demo` only: a run config's top level has none of
  them, and the ablations variant sets them there."""
  from orl_jax.config.sections import Demo
  demo_fields = {f.name for f in dataclasses.fields(Demo)} - {"extra"}   # Section's own
  assert len(demo_fields) == 8
  assert not demo_fields & {f.name for f in dataclasses.fields(RunConfig)}
  typed = run_config.convert(tiny.get_config("ablations"))
  assert typed.demo.seeds == (0, 1, 2) and typed.demo.warmup_seed == 3
  assert set(typed.demo.ablations) == set(tiny.ABLATIONS)
  assert typed.demo.stage_start["orl"] == "warmup"


def test_unknown_fields_and_wrong_types_are_named_together():
  config = tiny.get_config("smoke").to_dict()
  config["decode"]["blok_size"] = 8
  config["train"]["steps"] = "many"
  config["train"]["freeze_base"] = 1
  config["loss"]["w_kl"] = True
  config["surprise"] = 1
  with pytest.raises(ConfigError) as e:
    run_config.convert(config)
  lines = str(e.value).splitlines()
  assert lines[0] == "invalid config:" and len(lines) == 6
  assert "decode.blok_size is not a setting (did you mean block_size?)" in lines[1]
  text = str(e.value)
  for part in ("train.steps must be an integer, got 'many'",
               "train.freeze_base must be True or False, got 1",
               "loss.w_kl must be a number, got True", "surprise is not a setting"):
    assert part in text


def test_a_family_adds_its_own_settings_and_no_other_config_has_them():
  run = run_config.convert(dg_configs.get_config("debug"))
  arch = run.model.family_settings(ArchitectureSettings, "diffusion_gemma")
  assert arch.sliding_window == 8                               # the debug config's
  assert arch.full_every == 6                                   # the release's default
  assert run.decode.family_settings(SamplerSettings).t_min is None
  assert "t_min" in run.decode.to_dict()
  plain = run_config.convert(tiny.get_config("smoke"))
  with pytest.raises(KeyError, match="t_min"):
    plain.decode.family_settings(SamplerSettings)
  with pytest.raises(AttributeError):                           # no attribute lookup of extras
    plain.decode.t_min                                          # noqa: B018
  with pytest.raises(TypeError, match="diffusion_gemma is a ArchitectureSettings"):
    run.model.family_settings(SamplerSettings, "diffusion_gemma")
  bad = tiny.get_config("smoke").to_dict()
  bad["decode"]["t_min"] = 0.3                                  # a DiffusionGemma setting
  with pytest.raises(ConfigError, match=r"decode\.t_min is not a setting"):
    run_config.convert(bad)
  family = importlib.import_module("orl_jax.models.diffusion_gemma.family")
  assert set(family.FAMILY.config_sections) == {"model.diffusion_gemma", "decode"}


def test_replace_copies_and_the_run_config_is_frozen():
  run = run_config.convert(dg_configs.get_config("debug"))
  new = run.replace(**{"decode.rule": "threshold", "decode.t_min": 0.3, "seed": 5,
                       "model.diffusion_gemma.full_every": 2})
  t_min = lambda r: r.decode.family_settings(SamplerSettings).t_min
  full_every = lambda r: r.model.family_settings(ArchitectureSettings, "diffusion_gemma").full_every
  assert (new.decode.rule, t_min(new), new.seed, full_every(new)) == ("threshold", 0.3, 5, 2)
  assert (run.decode.rule, t_min(run), run.seed) == ("entropy_budget", None, 0)
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.decode.rule = "x"                                       # type: ignore[misc]
  with pytest.raises(ConfigError, match="no field 'rulez'"):
    run.replace(**{"decode.rulez": 1})
  assert pickle.loads(pickle.dumps(new)) == new and copy.deepcopy(new) == new
  assert isinstance(new.decode, Section) and isinstance(new, RunConfig)


def test_build_fills_the_decode_defaults_once_and_leaves_the_command_line_config_alone():
  config = dg_configs.get_config("debug")
  assert config.decode.rule_value is None
  run = run_config.build(config)
  assert run.decode.rule_value == 0.1                               # transformers' defaults
  assert run.decode.family_settings(SamplerSettings).t_max == 0.8
  assert config.decode.rule_value is None                          # not written back
  assert run_config.build(run) is run
  bad = tiny.get_config("smoke")
  bad.train.batch_size = 0
  with pytest.raises(ConfigError, match=r"train\.batch_size=0 must be positive"):
    run_config.build(bad)
  assert run_config.build(bad, rules=False).train.batch_size == 0  # sizing a layout only
