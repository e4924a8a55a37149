"""Bad input stops with one sentence that names the file or field (STYLE: "Errors are for
people"): damaged or foreign weight, config, tokenizer and data files; tokenizers that do not fit
the model; `model.init_from` folders with missing or extra tensors; values `validate` rejects;
misspelled command-line overrides."""
import gzip
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from configs import llada, sdar, tiny
from orl_jax.models import params_io
from orl_jax.config.build import ConfigError, build
from orl_jax.data.hf_tokenizer import HFTokenizer, TokenizerError, byte_level_tokenizer
from orl_jax.data.jsonl import DatasetError, load_jsonl_problems
from orl_jax.models import families, hf_read
from orl_jax.setup.build import build_setup, initial_params, params_meta
from orl_jax.models.build import init_model_params
from tests.support.helpers import orl_smoke_config, truncate_half

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOREIGN = b"PK\x03\x04" + bytes(range(256)) * 4        # a zip archive's start, then noise


def _one_sentence(message: str):
  assert "\n" not in message and "Traceback" not in message, message


def _damage(path, how):
  if how == "truncated":
    truncate_half(path)
  else:
    with open(path, "wb") as f:
      f.write(FOREIGN)


# ------------------------------------------------------------------------ files


@pytest.fixture(scope="module")
def smoke_setup():
  return build_setup(tiny.get_config("smoke"))


@pytest.fixture()
def params_dir(tmp_path, smoke_setup):
  """A params folder of the smoke model, as a training run exports it."""
  _, params = init_model_params(smoke_setup.model_cfg, 0)
  path = str(tmp_path / "params")
  params_io.save_params(path, params, params_meta(smoke_setup))
  return path


@pytest.mark.parametrize("how", ["truncated", "foreign"])
def test_unreadable_safetensors_are_named(tmp_path, smoke_setup, params_dir, how):
  weights = os.path.join(params_dir, params_io.PARAMS_FILE)
  _damage(weights, how)
  _, params = init_model_params(smoke_setup.model_cfg, 0)
  with pytest.raises(params_io.ParamsFileError, match="not a readable safetensors file") as e:
    params_io.load_params(params_dir, params)
  assert weights in str(e.value)
  _one_sentence(str(e.value))
  # the same for a Hugging Face model directory
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  single = str(hf_dir / hf_read.SINGLE_FILE)
  save_file({"lm_head.weight": np.ones((96, 64), np.float32)}, single)
  _damage(single, how)
  with pytest.raises(params_io.ParamsFileError, match=single):
    hf_read.weight_files(str(hf_dir))


@pytest.mark.parametrize("how", ["truncated", "foreign"])
def test_unreadable_json_files_are_named(tmp_path, params_dir, how):
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()
  config = hf_dir / hf_read.CONFIG_FILE
  config.write_text(json.dumps({"model_type": "qwen3", "vocab_size": 96, "hidden_size": 64}))
  _damage(str(config), how)
  with pytest.raises(params_io.ParamsFileError, match="not valid JSON") as e:
    hf_read.read_hf_config(str(hf_dir))
  assert str(config) in str(e.value)
  _one_sentence(str(e.value))
  meta = os.path.join(params_dir, params_io.META_FILE)
  _damage(meta, how)
  with pytest.raises(params_io.ParamsFileError, match=meta):
    params_io.read_meta(params_dir)


@pytest.mark.parametrize("how", ["truncated", "foreign"])
def test_unreadable_tokenizer_json_is_named(tmp_path, how):
  path = str(tmp_path / "tokenizer.json")
  byte_level_tokenizer().backend.save(path)
  _damage(path, how)
  with pytest.raises(TokenizerError, match="not a readable tokenizer.json") as e:
    HFTokenizer.from_file(path, {"mask": "<|mask|>", "eos": "<|eos|>"})
  assert path in str(e.value)
  _one_sentence(str(e.value))


def test_damaged_jsonl_files_are_named(tmp_path):
  good = '{"prompt": "1+1", "answer": 2}\n'
  cut = tmp_path / "cut.jsonl"
  cut.write_text(good + '{"prompt": "2+')
  binary = tmp_path / "binary.jsonl"
  binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)))
  gz = tmp_path / "data.jsonl.gz"
  with gzip.open(gz, "wt") as f:
    f.write(good * 500)
  truncate_half(gz)
  plain_gz = tmp_path / "plain.jsonl.gz"
  plain_gz.write_text(good)
  for path, phrase in ((cut, "cut.jsonl:2: not valid JSON"), (binary, "not UTF-8 text"),
                       (gz, "gzip data is truncated"), (plain_gz, "not a gzip file")):
    with pytest.raises(DatasetError, match=phrase) as e:
      load_jsonl_problems(path)
    assert str(path) in str(e.value)
    _one_sentence(str(e.value))
  with pytest.raises(DatasetError, match="truncated"):
    load_jsonl_problems(cut)


# ------------------------------------------------------------------ vocabularies


def test_a_tokenizer_larger_than_the_checkpoint_vocabulary_is_blamed(tmp_path):
  """model.vocab_size defaults to the tokenizer's size, so the check must compare the
  tokenizer with the checkpoint's config.json, and name both."""
  hf_dir = tmp_path / "model"
  hf_dir.mkdir()
  (hf_dir / hf_read.CONFIG_FILE).write_text(json.dumps({"model_type": "qwen3", "vocab_size": 260}))
  bigger = byte_level_tokenizer().backend
  bigger.add_tokens([f"<extra_{i}>" for i in range(40)])
  tok_path = str(tmp_path / "other_tokenizer.json")
  bigger.save(tok_path)
  c = sdar.get_config("debug")
  c.model.path, c.model.tokenizer = str(hf_dir), tok_path
  c.model.special_tokens.update(dict(mask="<|mask|>", eos="<|eos|>", pad="<|pad|>", bos=""))
  with pytest.raises(TokenizerError) as e:
    build_setup(c)
  msg = str(e.value)
  assert msg.startswith(tok_path) and f"{hf_dir}/config.json" in msg
  assert "300 tokens" in msg and "260 embedding rows" in msg
  _one_sentence(msg)


def test_init_from_with_another_vocabulary_names_both_sides(params_dir, smoke_setup):
  meta_path = os.path.join(params_dir, params_io.META_FILE)
  meta = params_io.read_meta(params_dir)
  meta["vocab_hash"] = "0123456789abcdef"
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  c = tiny.get_config("smoke")
  c.model.init_from = params_dir
  with pytest.raises(params_io.ParamsFileError, match="another vocabulary") as e:
    initial_params(build_setup(c))
  msg = str(e.value)
  assert meta_path in msg and "0123456789abcdef" in msg
  assert smoke_setup.tokenizer.vocab_hash() in msg and "tiny task's tokenizer" in msg
  _one_sentence(msg)


# ------------------------------------------------------------ init_from tensors


def _rewrite(params_dir, edit):
  path = os.path.join(params_dir, params_io.PARAMS_FILE)
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path)


def test_init_from_missing_a_tensor_is_an_error(params_dir):
  _rewrite(params_dir, lambda t: t.pop("lm_head.kernel"))
  c = tiny.get_config("smoke")
  c.model.init_from = params_dir
  with pytest.raises(params_io.ParamsFileError) as e:
    initial_params(build_setup(c))
  msg = str(e.value)
  assert os.path.join(params_dir, params_io.PARAMS_FILE) in msg
  assert "lacks 1 tensor" in msg and "lm_head.kernel" in msg
  _one_sentence(msg)


def test_init_from_with_an_extra_tensor_is_an_error(params_dir):
  _rewrite(params_dir, lambda t: t.update({"layers.9.mlp.up_proj.kernel": np.zeros((2, 2),
                                                                                 np.float32)}))
  c = tiny.get_config("smoke")
  c.model.init_from = params_dir
  with pytest.raises(params_io.ParamsFileError, match="layers.9.mlp.up_proj.kernel") as e:
    initial_params(build_setup(c))
  _one_sentence(str(e.value))


def test_init_from_adds_only_adapter_parameters_and_logs_them(params_dir, caplog):
  c = orl_smoke_config(params_dir + "_orl")             # residual.mode = "adapter"
  c.model.init_from = params_dir
  with caplog.at_level(logging.WARNING):
    _, params = initial_params(build_setup(c))
  fresh = [n for n in params_io.flatten(params.to_pure_dict()) if params_io.is_adapter(n)]
  assert fresh
  logged = [r.getMessage() for r in caplog.records if "adapter parameters start" in r.getMessage()]
  assert len(logged) == 1 and all(n in logged[0] for n in fresh), logged


# ----------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value", [
    ("train.lr", -1.0), ("train.lr", 0.0), ("train.steps", -3), ("train.batch_size", 0),
    ("train.log_every", 0), ("train.warmup_steps", -1), ("eval.batch_size", 0),
    ("orl.group_size", 0), ("orl.prompts_per_step", 0), ("model.n_kv_heads", 0),
    ("checkpoint.keep", 0), ("replay.n_rows", 0), ("eval.n_problems", -1),
    ("eval.n_problems", 10**6)])
def test_validate_rejects_values_that_cannot_run(field, value):
  c = orl_smoke_config("unused")
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError) as e:
    build(c)
  assert f"{field}={value}" in str(e.value)


@pytest.mark.parametrize("field,value,phrase", [
    ("replay.layout", "staircase", "must be one of"),
    ("replay.row_len", 40, "raise replay.row_len to at least 64")])
def test_validate_rejects_a_replay_that_cannot_hold_a_state(field, value, phrase):
  """Caught at start-up, not after the first rollout."""
  c = orl_smoke_config("unused")   # prompt_len 32 + gen_length 32
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError) as e:
    build(c)
  assert f"{field}={value!r}" in str(e.value) or f"{field}={value}" in str(e.value)
  assert phrase in str(e.value)


def test_validate_names_an_unknown_family_with_the_registry_message():
  """One rule for `model.hf_family`: the registry's (`families.get`), gathered by validate."""
  c = orl_smoke_config("unused")
  c.model.hf_family = "mistral"
  with pytest.raises(ConfigError) as e:
    build(c)
  with pytest.raises(ValueError) as registry:
    families.get("mistral")
  assert str(registry.value) in str(e.value)


def _launch(*args):
  return subprocess.run([sys.executable, "launch/train.py", "--config=configs/tiny.py:smoke",
                         *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_a_demo_setting_set_at_the_top_level_names_its_section():
  """The demo's settings moved into `config.demo`: the old key names the new one."""
  out = _launch("--config.seeds=(0,1)")
  assert out.returncode == 2
  assert out.stderr.strip() == ("train.py: --config.seeds: config has no field 'seeds'; set "
                                "--config.demo.seeds (the demo pipeline's own section) instead"
                                ), out.stderr


def test_misspelled_override_prints_one_line_with_the_suggestion():
  out = _launch("--config.train.lrr=1e-3")
  assert out.returncode == 2
  assert out.stderr.strip() == ("train.py: --config.train.lrr: config.train has no field 'lrr'; "
                                "did you mean --config.train.lr?"), out.stderr


def test_launcher_reports_bad_input_in_one_line(tmp_path, params_dir):
  out = _launch("--config.train.lr=-1", f"--config.workdir={tmp_path / 'w1'}")
  assert out.returncode == 1
  assert out.stderr.strip() == "train.py: invalid config: train.lr=-1.0 must be positive", \
      out.stderr
  _rewrite(params_dir, lambda t: t.pop("lm_head.kernel"))
  out = _launch(f"--config.model.init_from={params_dir}", f"--config.workdir={tmp_path / 'w2'}")
  assert out.returncode == 1
  # absl's log lines start with the level and MMDD (W1201 in December): not the error line
  lines = [ln for ln in out.stderr.splitlines() if not re.match(r"[IWEF]\d{4} ", ln)]
  assert len(lines) == 1 and "lacks 1 tensor" in lines[0] and "lm_head.kernel" in lines[0], \
      out.stderr


def test_an_evaluation_batch_the_mesh_cannot_split_is_refused_before_any_work():
  """The demo and evaluation decode each batch split over the mesh's batch shards: a batch size
  that does not divide is refused when the mesh is known, naming the field."""
  from orl_jax.setup.resolve import check_divisible_by_shards
  c = tiny.get_config("demo")
  c.eval.batch_size = 6
  with pytest.raises(ConfigError, match="eval.batch_size=6"):
    check_divisible_by_shards(c, 4)
  c.eval.batch_size = 8
  check_divisible_by_shards(c, 4)
  c.pipeline, c.eval.batch_size = "train", 6      # plain training does not evaluate
  check_divisible_by_shards(c, 4)


# ------------------------------------------------- the paths a researcher takes first


def _launcher(script, *args):
  """A launcher run that must stop with exit status 1 and one line on stderr (absl's
  warning lines aside): that line."""
  out = subprocess.run([sys.executable, f"launch/{script}", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [ln for ln in out.stderr.splitlines()
           if ln.strip() and not re.match(r"[IWEF]\d{4} |WARNING:", ln)]
  assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  return lines[0]


def test_a_missing_data_file_is_one_line(tmp_path):
  line = _launcher("train.py", "--config=configs/llada.py:debug-jsonl",
                   f"--config.task.path={tmp_path / 'my_train.jsonl'}",
                   f"--config.workdir={tmp_path / 'w'}")
  assert line == (f"train.py: {tmp_path / 'my_train.jsonl'} does not exist: set task.path to a "
                  "JSONL file of problems (one JSON object per line, e.g. "
                  "examples/math_and_code.jsonl).")


def test_prompts_longer_than_the_configured_length_stop_when_the_data_loads(tmp_path):
  """Named at start-up with the longest prompt and the value to set, before any compile."""
  line = _launcher("train.py", "--config=configs/llada.py:debug-jsonl",
                   "--config.task.prompt_len=64", f"--config.workdir={tmp_path / 'w'}")
  # the byte-level debug tokenizer: one token per UTF-8 byte, no chat template
  with open(os.path.join(ROOT, "examples", "math_and_code.jsonl")) as f:
    records = [json.loads(ln) for ln in f]
  longest = max(records, key=lambda r: len(r["prompt"].encode()))
  n = len(longest["prompt"].encode())
  assert line == (f"train.py: task.path=examples/math_and_code.jsonl: prompt {longest['id']!r} is "
                  f"{n} tokens (with the chat template 'none'), longer than task.prompt_len=64: "
                  f"set --config.task.prompt_len={-(-n // 8) * 8} (a multiple of "
                  "decode.block_size=8) or shorten it")
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_an_evaluation_larger_than_the_set_names_its_size_and_what_to_set(tmp_path):
  line = _launcher("eval.py", "--config=configs/llada.py:debug-jsonl",
                   "--config.eval.random_init=True", "--config.eval.n_problems=100",
                   f"--config.workdir={tmp_path}")
  assert line == ("eval.py: eval.n_problems=100 but the jsonl evaluation set has 36 problems: "
                  "set --config.eval.n_problems=36 (or 0 for all of them), or add problems to "
                  "task.path='examples/math_and_code.jsonl'")
  from orl_jax.evaluate import n_evaluated
  c = sdar.get_config("debug")
  c.task.name, c.eval.n_problems = "gsm8k", 2000
  with pytest.raises(ConfigError, match="has 1319 problems: .* that is the whole test split"):
    n_evaluated(c, 1319)
  c.eval.n_problems = 0
  assert n_evaluated(c, 1319) == 1319


def test_export_eval_and_decode_of_a_folder_that_is_not_a_trained_run(tmp_path):
  """The export launcher given another folder says so in one line; evaluation and decoding
  resolve their weights the same way (`weights.resolve`): an unfinished run's work directory
  and a missing path are one ConfigError each."""
  other, unfinished = tmp_path / "other", tmp_path / "unfinished"
  other.mkdir()
  (unfinished / "checkpoints").mkdir(parents=True)
  (unfinished / "config.json").write_text("{}")      # the run's config, not a model's
  line = _launcher("export.py", "--config=configs/llada.py:debug", f"--params={other}",
                   f"--out={tmp_path / 'o'}")
  assert line.startswith(f"export.py: --params={str(other)!r} holds neither a Hugging Face "
                         "model directory"), line
  from orl_jax.storage.trained_run import model_config_for
  from tests.support.hf import decode_launcher
  config = llada.get_config("debug")
  with pytest.raises(ConfigError, match="a run that has not finished") as e:
    model_config_for(config, str(unfinished))
  _one_sentence(str(e.value))
  with pytest.raises(ConfigError, match="--models=.* does not exist") as e:
    decode_launcher().models_to_decode(config, f"x={tmp_path / 'missing'}")
  _one_sentence(str(e.value))


def test_a_prompt_outside_the_tiny_vocabulary_names_the_words(tmp_path):
  """`--prompt` on a model of the tiny task (the :debug configs): the words it cannot read,
  and a prompt it can."""
  line = _launcher("decode.py", "--config=configs/sdar.py:debug", "--config.eval.random_init=True",
                   "--models=random=assets/tiny_base", "--prompt=What is 7 * 8?",
                   f"--html={tmp_path / 'p.html'}")
  assert "outside the tiny task's vocabulary ('8?', 'What', 'is')" in line, line


# ------------------------------------------------------------ config files and meshes

LAUNCHERS = ("train.py", "eval.py", "decode.py", "export.py", "compile.py", "serve.py")


def _command_line_mistake(script, *args):
  """A launcher run that must stop before any work with exit status 2 and one line on stderr
  (what the compile launcher's compilers log at start-up aside): that line."""
  out = subprocess.run([sys.executable, f"launch/{script}", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [ln for ln in out.stderr.splitlines()
           if ln.strip() and not re.match(r"[IWEF]\d{4} |WARNING:", ln)]
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  assert "Traceback" not in out.stderr and out.stdout == "", out.stderr[-3000:]
  return lines[0]


@pytest.mark.parametrize("script", LAUNCHERS)
def test_an_unknown_variant_is_one_line_with_the_variants(script):
  line = _command_line_mistake(script, "--config=configs/llada.py:debugjsonl",
                               "--config.train.steps=3")
  assert line == (f"{script}: configs/llada.py has no variant 'debugjsonl' (did you mean "
                  "'debug-jsonl'?); its variants are 2.1-mini, 2.1-mini-dllm, 2.1-mini-sglang, "
                  "2.0-mini, 8b-instruct, 8b-base, debug, debug-jsonl")


@pytest.mark.parametrize("script", LAUNCHERS)
def test_a_missing_config_file_is_one_line_with_the_config_files(script):
  line = _command_line_mistake(script, "--config=configs/lada.py", "--config.train.steps=3")
  assert line == (f"{script}: --config: configs/lada.py does not exist (did you mean "
                  "configs/llada.py?); the config files are configs/diffusion_gemma.py, "
                  "configs/llada.py, configs/qwendlm.py, configs/sdar.py, configs/tiny.py")


def test_other_command_line_mistakes_are_one_line():
  """No --config, a module that is no config file, a value of the wrong type, no weights to
  decode (absl would print the whole --help text before it)."""
  assert _command_line_mistake("train.py") == (
      "train.py: --config is missing: give a config file and its variant, e.g. "
      "--config=configs/tiny.py:smoke")
  assert _command_line_mistake("eval.py", "--config=configs/dlm_common.py").startswith(
      "eval.py: --config: configs/dlm_common.py is not a config file (it has no get_config); "
      "the config files are configs/diffusion_gemma.py, ")
  assert _command_line_mistake("train.py", "--config=configs/tiny.py:smoke",
                               "--config.train.steps=abc") == (
      "train.py: --config.train.steps: config.train.steps takes an integer, not 'abc'")
  assert _command_line_mistake("decode.py", "--config=configs/llada.py:debug").startswith(
      "decode.py: give weights: --config.model.path=DIR")


def test_settings_no_run_can_use_are_one_sentence_naming_the_way_out():
  """A float that reads as infinite or NaN (`--config.train.lr=1e400`) is refused, not trained
  with; an expert-split mesh on the dense expert compute names both ways out."""
  for field, value in (("train.lr", float("inf")), ("decode.temperature", float("nan"))):
    c = tiny.get_config("smoke")
    section, name = field.split(".")
    with c.unlocked():
      c[section][name] = value
    with pytest.raises(ConfigError) as e:
      build(c)
    assert str(e.value) == f"invalid config: {field}={value} must be a finite number"
  c = llada.get_config("debug")
  with c.unlocked():
    c.mesh.expert = 8
  with pytest.raises(ConfigError) as e:
    build(c)
  assert str(e.value) == (
      "invalid config: mesh.expert=8 splits the MoE experts, which needs the ragged (dropless) "
      "expert compute: set model.moe.impl='ragged' (got 'dense'), or mesh.expert=1 to keep the "
      "experts whole")


def test_a_mesh_that_does_not_fit_the_devices_names_the_settings_that_do(tmp_path):
  """configs/diffusion_gemma.py splits the experts 8 ways (mesh.expert=8): on a host with one
  device the decode launcher says what to set instead."""
  from tests.support.hf import family_dir
  line = _launcher("decode.py", "--config=configs/diffusion_gemma.py",
                   f"--config.model.path={family_dir(tmp_path, 'diffusion_gemma')}",
                   "--config.decode.block_size=16", "--prompt=hello")
  assert line == ("decode.py: config.mesh (data=1, fsdp=-1, tensor=1, expert=8) does not fit "
                  "the 1 device the run has: set --config.mesh.expert=1 (data x fsdp x tensor x "
                  "expert must equal the device count; -1 takes the rest)")
  line = _launcher("train.py", "--config=configs/tiny.py:smoke", "--config.mesh.data=2",
                   f"--config.workdir={tmp_path / 'w'}")
  assert line.startswith("train.py: config.mesh (data=2, fsdp=1, tensor=1, expert=1) does not "
                         "fit the 1 device the run has: set --config.mesh.data=1 ")
  from orl_jax.sharding import fitting_mesh
  assert fitting_mesh(dict(data=-1, fsdp=1, tensor=1, expert=1), 8) == {}
  assert fitting_mesh(dict(data=1, fsdp=-1, tensor=4, expert=8), 8) == {"tensor": 1}
  assert fitting_mesh(dict(data=2, fsdp=1, tensor=1, expert=1), 4) == {"data": -1}
  assert fitting_mesh(dict(data=-1, fsdp=3, tensor=1, expert=0), 4) == {"fsdp": 1, "expert": 1}


def test_a_malformed_jsonl_line_is_named_at_its_column(tmp_path):
  """An object left open is reported where its line ends (json alone would name column 1 of the
  line after), and a record missing keys names its kind in plain English."""
  bad = tmp_path / "open.jsonl"
  bad.write_text('{"prompt": "What is 2+2?", "answer": 4\n{"prompt": "1+1", "answer": 2}\n')
  with pytest.raises(DatasetError) as e:
    load_jsonl_problems(bad)
  assert str(e.value) == f"{bad}:1: not valid JSON (Expecting ',' delimiter, column 39)."
  code = tmp_path / "code.jsonl"
  code.write_text('{"prompt": "def f():", "tests": "assert f() == 1"}\n')
  with pytest.raises(DatasetError) as e:
    load_jsonl_problems(code)
  assert str(e.value).startswith(f"{code}:1: missing key(s) ['entry_point'] for a code task "
                                 "(has 'tests'/'entry_point');"), str(e.value)
  answer = tmp_path / "answer.jsonl"
  answer.write_text('{"prompt": "1+1"}\n')
  with pytest.raises(DatasetError, match="missing key\\(s\\) \\['answer'\\] for an answer task;"):
    load_jsonl_problems(answer)
