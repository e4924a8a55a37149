"""generation_config.json as transformers' `GenerationConfig.save_pretrained` writes it: every
field it was not given is `null`, meaning unset, so the decode field takes its default (the
directory's value where it sets one); metadata keys (`transformers_version`,
`_from_model_config`) are ignored; a value of the wrong type or out of range is still refused
in one message naming the file and the field."""
import json
import os

import pytest

from configs import diffusion_gemma as dg_configs
from orl_jax.models import hf_read
from orl_jax.models.diffusion_gemma.family import GENERATION_DEFAULTS
from orl_jax.models.diffusion_gemma.sampler import SamplerSettings

DEFAULT = "transformers' default"
# what DiffusionGemmaGenerationConfig(max_new_tokens=300, t_min=0.3).save_pretrained writes
# (transformers 5.24), with the token ids and metadata a model's own config adds as null
SAVED = {"confidence_threshold": None, "max_denoising_steps": None, "max_new_tokens": 300,
         "return_dict_in_generate": True, "sampler_config": None, "stability_threshold": None,
         "t_max": None, "t_min": 0.3, "transformers_version": "5.24.0",
         "_from_model_config": True, "bos_token_id": None, "eos_token_id": None,
         "pad_token_id": None, "cache_implementation": None}


def _write(path, data: dict) -> str:
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, hf_read.GENERATION_CONFIG_FILE), "w") as f:
    json.dump(data, f, indent=2)
  return str(path)


def _fill(hf_dir: str) -> tuple[dict, dict]:
  """({decode field: value}, {decode field: origin}) a DiffusionGemma run takes from `hf_dir`."""
  decode = dg_configs.get_config().decode
  return hf_read.decode_defaults(decode, hf_dir, GENERATION_DEFAULTS)


def _official_defaults() -> dict:
  return {field: default for field, (_, default, _) in GENERATION_DEFAULTS.items()}


def test_null_fields_take_the_default_and_set_fields_are_taken(tmp_path):
  values, origins = _fill(_write(tmp_path, SAVED))
  want = dict(_official_defaults(), gen_length=512, t_min=0.3)   # 300 -> two 256-canvases
  assert values == want
  assert origins == dict({f: DEFAULT for f in GENERATION_DEFAULTS},
                         gen_length="generation_config.json max_new_tokens",
                         t_min="generation_config.json t_min")
  assert hf_read.declared_special_tokens(str(tmp_path)) == {}         # null ids: none declared


@pytest.mark.parametrize("sampler_config,bound,origin", [
    (None, 0.1, DEFAULT),
    ({"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": None}, 0.1, DEFAULT),
    ({"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.2}, 0.2,
     "generation_config.json sampler_config.entropy_bound")])
def test_the_sampler_bound_null_or_set(tmp_path, sampler_config, bound, origin):
  values, origins = _fill(_write(tmp_path, dict(SAVED, sampler_config=sampler_config)))
  assert (values["rule_value"], origins["rule_value"]) == (bound, origin)


def test_a_file_written_by_transformers_is_read(tmp_path):
  generation = pytest.importorskip(
      "transformers.models.diffusion_gemma.generation_diffusion_gemma")
  generation.DiffusionGemmaGenerationConfig(
      max_new_tokens=300, t_min=0.3,
      sampler_config=generation.EntropyBoundSamplerConfig(entropy_bound=0.2),
  ).save_pretrained(str(tmp_path))
  written = json.load(open(tmp_path / hf_read.GENERATION_CONFIG_FILE))
  assert written["max_denoising_steps"] is None                 # what this test is about
  values, origins = _fill(str(tmp_path))
  assert values == dict(_official_defaults(), gen_length=512, t_min=0.3, rule_value=0.2)
  assert origins["max_steps_per_block"] == DEFAULT


BAD = [("max_denoising_steps", -3, "max_denoising_steps=-3 must be an integer >= 1"),
       ("max_denoising_steps", "48", 'max_denoising_steps="48" must be an integer >= 1'),
       ("max_new_tokens", 0, "max_new_tokens=0 must be an integer >= 1"),
       ("t_max", "hot", 't_max="hot" must be a finite number > 0'),
       ("stability_threshold", -1, "stability_threshold=-1 must be an integer >= 0"),
       ("sampler_config", {"entropy_bound": -0.1},
        "sampler_config.entropy_bound=-0.1 must be a finite number > 0"),
       ("sampler_config", "entropy", 'sampler_config="entropy" must be an object or null')]


@pytest.mark.parametrize("key,value,message", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_an_invalid_value_is_still_refused(tmp_path, key, value, message):
  path = _write(tmp_path, dict(SAVED, **{key: value}))
  with pytest.raises(hf_read.CheckpointError) as e:
    _fill(path)
  assert str(e.value) == f"{os.path.join(path, hf_read.GENERATION_CONFIG_FILE)}: {message}"


def test_a_diffusion_gemma_directory_saved_by_transformers_sets_up(tmp_path):
  """The run's set-up on a directory whose generation_config.json has null fields: the nulls
  take transformers' defaults, the ids come from config.json, the set fields are taken."""
  from orl_jax.setup.build import build_setup
  from tests.support.hf import EOS, PAD, PROMPT, config_of, family_dir
  path = family_dir(tmp_path, "diffusion_gemma")        # canvases of 16; eos 298, pad 299
  _write(path, SAVED)
  c = config_of("diffusion_gemma", path)
  with c.unlocked():
    c.decode.gen_length, c.decode.t_max, c.replay.row_len = None, None, 512
  s = build_setup(c, prompts=[PROMPT])
  d = s.config.decode
  assert (s.model_cfg.eos_ids, s.model_cfg.pad_id) == ((EOS,), PAD)
  own = d.family_settings(SamplerSettings)
  assert (d.gen_length, own.t_min, own.t_max, own.confidence_threshold) == (304, 0.3, 0.8, 0.005)
