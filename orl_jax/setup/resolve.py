"""What a config resolves to before anything is allocated: the weights directory and registry
family (`resolve_model`), the tokenizer and special tokens (`load_tokenizer`,
`special_tokens`), the model config (`hf_model_config`, `own_model_config`; without a tokenizer
`orl_jax.setup.build.run_model_config` and `sizing_model_config` build on these), the special
ids without a tokenizer (`special_ids`), the mesh (`run_mesh`, the batch dimensions checked
against its data shards) and the checks of prompt lengths. Resolved once here, for the set-up of
every run (`orl_jax.setup.build`), the dry run (`orl_jax/apps/dry_run.py`) and the compile
command (`orl_jax/aot/programs.py`)."""
from __future__ import annotations

import dataclasses
import logging

import jax

from orl_jax import sharding as sharding_lib
from orl_jax.config import derive as config_lib
from orl_jax.config.sections import RunConfig
from orl_jax.decode import build as decode_build
from orl_jax.models import families
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib


def model_family(config, hf_dir: str = "") -> str:
  """The registry family of the run: named by the weights' config.json `model_type` when they
  are a Hugging Face directory, else `model.hf_family` ('' for a model of ours)."""
  if hf_dir:
    from orl_jax.models import hf_read
    return hf_read.family_of(hf_dir)
  return config.model.hf_family


def load_tokenizer(config, hf_dir: str = "", family: str = ""):
  """The configured tokenizer: `model.tokenizer` ('byte', 'tiny' -- the tiny task's word
  tokenizer, as a run of it records -- or a tokenizer.json path), else the weights
  directory's tokenizer.json, else None (the task's own: tiny's word tokenizer, or the
  byte-level debug tokenizer for real-text tasks). Its special tokens: `special_tokens`."""
  m = config.model
  path = m.tokenizer or hf_dir
  if path == "byte":
    from orl_jax.data.hf_tokenizer import byte_level_tokenizer
    return byte_level_tokenizer()
  if path == trained_run.TINY:
    from orl_jax.data import tiny_task
    return tiny_task.tiny_tokenizer()
  if not path:
    return None
  from orl_jax.data.hf_tokenizer import HFTokenizer
  special, origins = special_tokens(config, hf_dir, family)
  needs_mask = decode_build.sampler_of(config, family=family).needs_mask_token
  tok = HFTokenizer.from_file(path, special, origins, require_mask=needs_mask)
  # where each id came from, for a log at INFO (launch/decode.py prints it with each model)
  logging.info("special tokens of %s: %s", tok.source, tok.origins_text())
  return tok


def special_tokens(config, hf_dir: str = "", family: str = "") -> tuple[dict, dict]:
  """({role: value}, {role: where it came from}) of the run's special tokens: for each of mask,
  eos, pad and bos, `model.special_tokens.<role>` when set (a token string or id: the user's
  choice wins), else the id the weights directory declares (generation_config.json, then
  config.json), else the family's default."""
  from orl_jax.models import hf_read
  own = _own_special_tokens(config, family)
  declared = hf_read.declared_special_tokens(hf_dir) if hf_dir else {}
  defaults = families.get(family).special_tokens
  values, origins = {}, {}
  for role in ("mask", "eos", "pad", "bos"):
    if own.get(role):
      values[role], origins[role] = _token_list(own[role]), f"model.special_tokens.{role}"
    elif role in declared:
      values[role], origins[role] = list(declared[role][0]), declared[role][1]
    elif defaults.get(role):
      values[role], origins[role] = defaults[role], f"the {family} family's default"
  return values, origins


def _token_list(value):
  """A `model.special_tokens` value: a token, an id, or ids separated by commas (several EOS
  ids, as a trained run records them) -> the token, or the list of ids."""
  if isinstance(value, str) and "," in value:
    return [int(v) for v in value.split(",")]
  return value


def _own_special_tokens(config, family: str) -> dict:
  """The `model.special_tokens` entries the config sets (non-empty); logs once when the weights
  are of another family than the config was written for (its decoder and chat defaults stay)."""
  m = config.model
  configured = {k: v for k, v in m.special_tokens.to_dict().items() if v}
  written_for = m.hf_family
  if family and written_for and written_for != family:
    logging.warning("model.path is a %r model and the config is written for %r: special tokens "
                    "come from the directory and the %r family (decoder and chat defaults stay "
                    "the config's)", family, written_for, family)
  return configured


def hf_model_config(config, tok, hf_dir: str, family: str):
  """The ModelConfig of a run from a Hugging Face directory: the family and every architecture
  field from its config.json, checked against the tokenizer."""
  from orl_jax.data.hf_tokenizer import TokenizerError, check_model_vocab
  from orl_jax.models import hf_read
  arch = hf_read.read_architecture(hf_dir, family)
  where = f"{hf_dir}/config.json"
  ignored = hf_read.ignored_settings(hf_dir, family)
  if ignored:   # informational (released files and our exports carry them): no warning
    logging.info("%s sets %s: the official %s code never reads these keys, so they are "
                 "ignored", where, ", ".join(ignored), family)
  if hasattr(tok, "vocab_hash"):
    # the tokenizer against the checkpoint's own vocabulary, so a foreign tokenizer is named
    check_model_vocab(tok, arch["vocab_size"], tok.mask_id, where=where)
  declared = hf_read.declared_special_tokens(hf_dir).get("mask")
  if declared is not None and declared[0][0] != tok.mask_id:
    origin = getattr(tok, "origins", {}).get("mask", "")
    if not origin.startswith("model.special_tokens"):
      raise TokenizerError(f"{hf_dir}/{declared[1]} declares mask_token_id={declared[0][0]} but "
                           f"the tokenizer's mask is {tok.mask_id} (use the tokenizer the model "
                           "was trained with, or set model.special_tokens.mask)")
    logging.warning("model.special_tokens.mask=%s overrides mask_token_id=%s of %s",
                    tok.mask_id, declared[0][0], declared[1])
  return config_lib.model_config(config, vocab_size=arch["vocab_size"], mask_id=tok.mask_id,
                                 arch=arch, hf_family=family)


def own_model_config(config, hf_dir: str, family: str, vocab_size: int = 0, **special):
  """The config object of a family with its own model (`Family.config_from_run`): from
  `hf_dir`'s config.json (a CheckpointError naming the file and field) or from `config.model`;
  `special`: the run's resolved eos_ids / pad_id."""
  fam = families.get(family)
  assert fam.config_from_run is not None   # a family with its own model builds its config
  build = lambda hf_config: fam.config_from_run(
      config.model, block_size=config.decode.block_size, vocab_size=vocab_size,
      hf_config=hf_config, **special)
  if not hf_dir:
    return build(None)
  from orl_jax.models import hf_read
  return hf_read.parse_config_json(hf_dir, build)


@dataclasses.dataclass(frozen=True)
class RunModel:
  """Which model a config names, before anything is read or allocated: the Hugging Face
  directory of its weights ('' when `model.path` is none) and its registry family ('' for a
  model of ours)."""
  hf_dir: str
  family: str


def resolve_model(config: RunConfig) -> RunModel:
  """The weights directory and family of a run of `config` (a built RunConfig: the family's
  decode defaults already filled in): the first step of the training set-up (`build_setup`),
  the dry run and the compile command (`run_model_config`)."""
  hf_dir = weights_lib.hf_dir(config)
  return RunModel(hf_dir, model_family(config, hf_dir))


def run_mesh(config, devices=None):
  """The mesh of `config.mesh` on `devices` (default: this host's), the batch dimensions checked
  to divide over its data shards."""
  devices = jax.devices() if devices is None else devices
  try:
    mesh = sharding_lib.mesh_from_config(config, devices)
  except ValueError as e:   # axis sizes that do not fit the devices: what to set instead
    raise config_lib.ConfigError(sharding_lib.mesh_error(config, len(devices), e)) from None
  check_divisible_by_shards(config, sharding_lib.n_batch_shards(mesh.shape))
  return mesh


def special_id(value, default=0) -> int:
  return int(value) if isinstance(value, str) and value.isdigit() else default


def special_ids(config, model_cfg) -> tuple[int, int]:
  """(mask id, EOS id) of a run without its tokenizer: the model's mask and the config's EOS
  id when it is a number (ids only shape nothing; the compile command needs them to build)."""
  eos = getattr(model_cfg, "eos_ids", None)
  eos_id = eos[0] if eos else special_id(config.model.special_tokens.eos)
  return getattr(model_cfg, "mask_id", -1), eos_id


def check_prompt_lengths(config, task) -> None:
  """ConfigError naming the longest prompt and the `task.prompt_len` to set when a prompt of a
  task with a fixed problem list (a JSONL file, GSM8K, HumanEval, prompts to decode) does not
  fit: checked when the data loads, before anything compiles. An evaluation-only benchmark
  is checked on the `eval.n_problems` it scores. The tiny task's prompts fit its configs by
  construction (its generator is unbounded)."""
  if task.name == "tiny":
    return
  problems = task.eval_problems()
  if task.name in ("gsm8k", "humaneval") and config.eval.n_problems:
    problems = problems[:config.eval.n_problems]
  if not problems:
    return
  lengths = [len(task.tokenizer.encode(p.prompt)) for p in problems]
  longest = max(range(len(problems)), key=lengths.__getitem__)
  limit, block = config.task.prompt_len, config.decode.block_size
  if lengths[longest] <= limit:
    return
  where = {"jsonl": f"task.path={config.task.path}", "prompts": "--prompt"}.get(
      task.name, f"task.name={task.name}")
  fit = -(-lengths[longest] // block) * block
  raise config_lib.ConfigError(
      f"{where}: prompt {problems[longest].problem_id!r} is {lengths[longest]} tokens (with the "
      f"chat template {config.task.chat!r}), longer than task.prompt_len={limit}: "
      f"set --config.task.prompt_len={fit} (a multiple of decode.block_size={block}) or shorten "
      "it")


def needs_reference(config) -> bool:
  """The run keeps a frozen copy of its starting params (ORL with the KL anchor to it)."""
  return config.train.mode == "orl" and config_lib.loss_config(config).uses_reference


def check_divisible_by_shards(config, n_shards: int) -> None:
  """Batch dimensions split over the data axes must divide evenly (checked once the mesh,
  and so the device count, is known)."""
  sizes = {"train.batch_size": config.train.batch_size}
  if config.train.mode == "orl":
    o = config.orl
    sizes.update({"orl.prompts_per_step": o.prompts_per_step,
                  "replay.n_rows": config.replay.n_rows})
    if o.rollout_chunks > 1 and o.chunk_by == "prompts":   # each chunk's prompts are split too
      sizes["orl.prompts_per_step / orl.rollout_chunks"] = o.prompts_per_step // o.rollout_chunks
  if config.train.mode == "eval" or config.pipeline == "demo":
    sizes["eval.batch_size"] = config.eval.batch_size   # evaluation splits each batch too
  bad = [f"{k}={v}" for k, v in sizes.items() if v % n_shards]
  if bad:
    raise config_lib.ConfigError(f"{', '.join(bad)} must be divisible by the {n_shards} data "
                                 "shards of the mesh (mesh.data x mesh.fsdp x mesh.expert)")
