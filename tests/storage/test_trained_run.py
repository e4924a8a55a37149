"""A trained run carries what it was trained with (orl_jax/storage/trained_run.py): its params
folder records the model, tokenizer, special tokens and chat template, and export, evaluation and
decoding given the run's folder rebuild exactly that model and tokenizer from any config of the
family, command-line overrides still winning; folders that are not a finished run are refused
in one sentence."""
import dataclasses
import json
import os

import pytest

from configs import llada, tiny
from orl_jax.models import params_io
from orl_jax.models.build import init_model_params
from orl_jax.config.build import build
from orl_jax.setup.build import build_setup
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax.errors import ConfigError
from orl_jax.data.hf_tokenizer import byte_level_tokenizer


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory, finished_run):
  """A run of configs/llada.py:debug-jsonl with a tokenizer.json of its own (the byte-level
  one, written to a file) and special tokens set at training time (EOS = <|bos|>, id 3)."""
  workdir = tmp_path_factory.mktemp("run")
  tok_file = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
  byte_level_tokenizer().backend.save(tok_file)
  config = llada.get_config("debug-jsonl")
  config.task.path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                                  "examples", "math_and_code.jsonl")
  config.model.tokenizer = tok_file
  config.model.special_tokens.update(dict(mask="<|mask|>", eos="<|bos|>", pad="<|pad|>"))
  return workdir, finished_run(workdir, config)


def _architecture(model_cfg):
  """The model without the run-time choices (compute dtype, MoE kernel, per-layer
  recomputation) a config decides."""
  return dataclasses.replace(model_cfg, dtype="", remat=False,
                             moe=dataclasses.replace(model_cfg.moe, impl="dense"))


def test_any_config_of_the_family_rebuilds_the_trained_model_and_tokenizer(jsonl_run):
  """configs/llada.py (LLaDA2.1-mini's shapes, no tokenizer, no special-token override) given the
  run's work directory builds the debug model with the run's tokenizer and EOS."""
  workdir, trained = jsonl_run
  config = llada.get_config()
  config.task.path = trained.config.task.path
  cfg = trained_run.model_config_for(config, str(workdir))
  assert cfg.model.path == str(workdir / "params")
  s = build_setup(cfg)
  assert _architecture(s.model_cfg) == _architecture(trained.model_cfg)
  assert (s.model_cfg.d_model, s.model_cfg.n_layers) == (32, 4)     # not 2.1-mini's 2048, 20
  assert (s.tokenizer.eos_id, s.tokenizer.mask_id) == (3, trained.tokenizer.mask_id)
  assert s.tokenizer.vocab_hash() == trained.tokenizer.vocab_hash()
  assert cfg.model.tokenizer == str(workdir / "params" / trained_run.TOKENIZER_FILE)


def test_command_line_overrides_win_over_the_run(jsonl_run):
  workdir, trained = jsonl_run
  argv = ["eval.py", "--config=configs/llada.py", "--config.task.chat=llada",
          "--config.model.residual.mode", "none", "--config.eval.n_problems=2"]
  overridden = trained_run.overridden_fields(argv)
  assert overridden == {"task.chat", "model.residual.mode", "eval.n_problems"}
  config = llada.get_config()
  config.task.chat, config.model.residual.mode = "llada", "none"
  cfg = trained_run.model_config_for(config, str(workdir), overridden)
  assert (cfg.task.chat, cfg.model.residual.mode) == ("llada", "none")
  assert cfg.model.d_model == trained.model_cfg.d_model      # not overridden: the run's


def test_run_record_is_readable_json(jsonl_run):
  workdir, trained = jsonl_run
  with open(workdir / "params" / params_io.META_FILE) as f:
    run = json.load(f)[trained_run.RUN_KEY]
  assert run["tokenizer"] == trained_run.TOKENIZER_FILE and run["chat"] == "none"
  assert run["special_tokens"]["eos"] == [3] and run["model_type"] == ""
  assert os.path.isfile(workdir / "params" / trained_run.TOKENIZER_FILE)


def test_a_tiny_task_run_keeps_its_word_tokenizer(tmp_path, finished_run):
  """A tiny-task run records the task's word tokenizer (no file): a config of another task
  given the run builds that tokenizer and the run's model."""
  config = tiny.get_config("smoke")
  trained = finished_run(tmp_path, config)
  settings = trained_run.trained_settings(weights_lib.PARAMS, str(tmp_path / "params"))
  assert settings["model.tokenizer"] == trained_run.TINY and settings["task.chat"] == "none"
  assert settings["model.d_model"] == trained.model_cfg.d_model == 32
  assert not os.path.exists(tmp_path / "params" / trained_run.TOKENIZER_FILE)
  other = llada.get_config()       # task.name 'jsonl' without a file: as an export reads it
  s = build_setup(trained_run.model_config_for(other, str(tmp_path)), prompts=())
  assert s.tokenizer.vocab_hash() == trained.tokenizer.vocab_hash()
  assert (s.model_cfg.d_model, s.model_cfg.vocab_size) == (32, trained.model_cfg.vocab_size)


def test_folders_that_are_not_a_finished_run_are_refused_in_one_sentence(tmp_path, jsonl_run):
  workdir, _ = jsonl_run
  assert weights_lib.resolve(str(workdir)) == (weights_lib.PARAMS, str(workdir / "params"))
  assert weights_lib.display_name(str(workdir / "params")) == workdir.name
  unfinished = tmp_path / "unfinished"
  (unfinished / "checkpoints").mkdir(parents=True)
  (unfinished / "config.json").write_text("{}")          # the run's config, not a model's
  started = tmp_path / "started"   # only the config.json a run writes when it starts
  started.mkdir()
  (started / "config.json").write_text(json.dumps(build(tiny.get_config("smoke")).to_dict()))
  other = tmp_path / "other"
  other.mkdir()
  for path, phrase in ((unfinished, "a run that has not finished"),
                       (started, "a run that has not finished"),
                       (other, "holds neither"), (tmp_path / "nowhere", "does not exist")):
    with pytest.raises(ConfigError, match=phrase) as e:
      weights_lib.resolve(str(path), "--params")
    assert str(e.value).startswith(f"--params={str(path)!r}") and "\n" not in str(e.value)


def test_every_file_of_a_run_export_has_the_usual_modes(jsonl_run, tmp_path):
  """The params folder and the Hugging Face export read alike: 0666/0777 less the umask, as a
  plain open/mkdir gives (safetensors' writer and mkdtemp would leave theirs private)."""
  from orl_jax.storage.hf_export import export_hf_dir
  workdir, trained = jsonl_run
  _, params = init_model_params(trained.model_cfg, 0)
  hf = tmp_path / "hf"
  export_hf_dir(trained, params, str(hf))
  umask = os.umask(0)
  os.umask(umask)
  for folder in (workdir / "params", hf):
    assert os.stat(folder).st_mode & 0o777 == 0o777 & ~umask
    modes = {name: os.stat(folder / name).st_mode & 0o777 for name in os.listdir(folder)}
    assert any(name.endswith(".safetensors") for name in modes), modes
    assert set(modes.values()) == {0o666 & ~umask}, modes
