"""The life of a training run, shared by every loop (`sft.py`, `orl.py`): `build_setup`
(config -> task, tokenizer, model config, mesh), `prepare_run` (optimizer, sharded state,
checkpoint manager), `resume` (the newest checkpoint that restores) and `finish_run` (export the
final parameters).

What a config resolves to before anything is allocated -- the weights directory and family
(`resolve_model`), the mesh (`run_mesh`), and without a tokenizer the model config and special
ids (`run_model_config`, `special_ids`) -- is resolved here once, for the training set-up, the
dry run (`orl_jax/apps/dry_run.py`) and the compile command (`orl_jax/aot/programs.py`)."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import TYPE_CHECKING, Sequence, cast

import jax
from tqdm import tqdm   # text bars: also in notebooks, where widgets may not render

from orl_jax.config import derive as config_lib
from orl_jax import distributed
from orl_jax.models import params_io
from orl_jax.storage import run_settings as run_settings_lib
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax.config import build as run_config
from orl_jax.config.build import RunConfig
from orl_jax import sharding as sharding_lib
from orl_jax.storage.checkpoint import Checkpointer, abstract_like
from orl_jax.decode import build as decode_build, from_run
from orl_jax.metrics import MetricsWriter
from orl_jax.models import build, families
from orl_jax.models.family_base import AnyModelConfig
from orl_jax.models.transformer import ModelConfig
from orl_jax.tasks import Task, get_task, prompt_task
from orl_jax.train.state import (TrainState, create_train_state, init_model_params,
                                 optimizer_of)

if TYPE_CHECKING:
  import optax
  from flax import nnx
  from jax.sharding import Mesh


@dataclasses.dataclass
class Setup:
  """What every run derives from its config."""
  config: RunConfig
  task: Task
  model_cfg: AnyModelConfig   # ModelConfig, or the family's own class (DiffusionGemmaConfig)
  mesh: Mesh

  @property
  def tokenizer(self):
    return self.task.tokenizer


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


def _hf_model_config(config, tok, hf_dir: str, family: str):
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


def build_setup(config, *, prompts: Sequence[str] | None = None) -> Setup:
  """config -> task, tokenizer, model config (from model.path's config.json when it is a
  Hugging Face directory), mesh. `prompts`: the task is these texts (`tasks.prompt_task`,
  what launch/decode.py --prompt decodes) instead of `config.task`'s problems."""
  config = run_config.build(config)
  hf_dir, family = dataclasses.astuple(resolve_model(config))
  tokenizer = load_tokenizer(config, hf_dir, family)
  task = (get_task(config.task, tokenizer=tokenizer) if prompts is None
          else prompt_task(config.task, prompts, tokenizer))
  tok = task.tokenizer
  check_prompt_lengths(config, task)
  if families.get(family).own_model:   # DiffusionGemma: its own config class
    model_cfg = own_model_config(
        config, hf_dir, family, config.model.vocab_size or tok.vocab_size,
        eos_ids=getattr(tok, "eos_ids", (tok.eos_id,)), pad_id=getattr(tok, "pad_id", 0))
  elif hf_dir:
    model_cfg = _hf_model_config(config, tok, hf_dir, family)
  else:
    vocab_size = config.model.vocab_size or tok.vocab_size
    model_cfg = config_lib.model_config(config, vocab_size=vocab_size, mask_id=tok.mask_id)
    if hasattr(tok, "vocab_hash"):
      from orl_jax.data.hf_tokenizer import check_model_vocab
      check_model_vocab(tok, vocab_size, model_cfg.mask_id)
  return Setup(config, task, model_cfg, run_mesh(config))


def _special_id(value, default=0) -> int:
  return int(value) if isinstance(value, str) and value.isdigit() else default


def sizing_model_config(config, *, laid_out: bool = True):
  """The ModelConfig of `config` without reading a tokenizer (`model.vocab_size` must be set,
  or the task's tokenizer is used; a Hugging Face `model.path` gives the architecture).
  `laid_out`: experts are sized as laid out by the partition rules, not run
  (`expert_parallel` off); False keeps the run's own setting (the compile command)."""
  config = run_config.build(config, rules=False)
  hf_dir = weights_lib.hf_dir(config)
  vocab = config.model.vocab_size
  mask_id = _special_id(config.model.special_tokens.mask)
  if hf_dir or not vocab:
    cfg = cast(ModelConfig, build_setup(config).model_cfg)   # not a family with its own model
  else:
    cfg = config_lib.model_config(config, vocab_size=vocab, mask_id=mask_id)
  if cfg.moe is not None and laid_out:
    cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, expert_parallel=False))
  return cfg


def run_model_config(config):
  """The model config a run of `config` builds (a family's own config class included), its
  decoder defaults filled in, without weights: `model.path`'s config.json when it is a
  Hugging Face directory, else the config's fields (`model.vocab_size` set, as for sizing)."""
  config = run_config.build(config, rules=False)
  run = resolve_model(config)
  family = families.get(run.family)
  if not family.own_model:
    return sizing_model_config(config, laid_out=False)
  vocab = config.model.vocab_size
  if not vocab and not run.hf_dir:
    raise config_lib.ConfigError(f"set model.vocab_size (or model.path) to build a "
                                 f"{family.name} model without its weights")
  return own_model_config(config, run.hf_dir, family.name, vocab)


def special_ids(config, model_cfg) -> tuple[int, int]:
  """(mask id, EOS id) of a run without its tokenizer: the model's mask and the config's EOS
  id when it is a number (ids only shape nothing; the compile command needs them to build)."""
  eos = getattr(model_cfg, "eos_ids", None)
  eos_id = eos[0] if eos else _special_id(config.model.special_tokens.eos)
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


def initial_params(setup: Setup):
  """(graphdef, params): read from a Hugging Face `model.path` (straight into the family's
  partition-rule shardings), fresh, or loaded from a params folder (`model.path` or
  `model.init_from`). Only residual adapter parameters may be absent from the weights (they keep
  their zero-output initialisation, and are logged); any other missing or extra tensor is an
  error."""
  weights = weights_lib.weights_of(setup.config)
  if weights is not None and weights.kind == weights_lib.HF:
    from orl_jax.models import hf_read
    _, abstract = build.abstract_params(setup.model_cfg, setup.config.seed)
    shardings = sharding_lib.tree_shardings(abstract, setup.mesh,
                                            families.of_model(setup.model_cfg).partition_rules)
    return hf_read.load_model_params(weights.path, setup.model_cfg.hf_family, setup.model_cfg,
                                     shardings=shardings, seed=setup.config.seed,
                                     check_config=False)
  graphdef, params = init_model_params(setup.model_cfg, setup.config.seed)
  if weights is not None:
    check_compatible(weights.path, setup)
    params, kept = params_io.load_params(weights.path, params)
    if kept:
      logging.warning("%s=%s has no residual adapter: %d adapter parameters start from their "
                      "initialisation (%s)", weights.field, weights.path, len(kept),
                      ", ".join(kept))
  return graphdef, params


# ModelConfig fields that decide which tensors exist and their shapes (only these are compared:
# meta.json of older runs names the attention layout `family`, now `attention`, unread here)
_SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
                 "qk_norm", "tie_embeddings", "first_k_dense")


def check_compatible(params_dir: str, setup: Setup) -> None:
  """Raises ValueError naming both sides when the folder's meta.json records another vocabulary
  or another model shape than the configured one."""
  meta_path = os.path.join(params_dir, params_io.META_FILE)
  meta = params_io.read_meta(params_dir)
  vocab = meta.get("vocab_hash")
  stored = meta.get("model", {})
  tok = setup.tokenizer
  tok_name = getattr(tok, "source", None) or f"the {setup.config.task.name} task's tokenizer"
  if vocab and hasattr(tok, "vocab_hash") and vocab != tok.vocab_hash():
    raise params_io.ParamsFileError(
        f"{meta_path} records another vocabulary (hash {vocab}) than {tok_name} (hash "
        f"{tok.vocab_hash()}, {tok.vocab_size} tokens): use the "
        "tokenizer the parameters were trained with, or retrain them (`make base`)")
  ours = dataclasses.asdict(setup.model_cfg)
  if "vocab_size" in stored and stored["vocab_size"] != ours["vocab_size"]:
    raise params_io.ParamsFileError(
        f"{meta_path} has vocab_size={stored['vocab_size']} but the model built from {tok_name} "
        f"has {ours['vocab_size']} rows: use the tokenizer the parameters were trained with (or "
        "set model.vocab_size)")
  bad = [f"model.{k}={ours[k]!r} but {params_io.META_FILE} says {stored[k]!r}"
         for k in _SHAPE_FIELDS if k in stored and stored[k] != ours[k]]
  if bad:
    raise params_io.ParamsFileError(f"{meta_path} describes another model than the config "
                                    f"({'; '.join(bad)}): set those fields or point "
                                    "model.path at another folder")


def params_meta(setup: Setup, extra: dict | None = None) -> dict:
  meta = {"model": dataclasses.asdict(setup.model_cfg), "task": setup.config.task.to_dict(),
          "decode": setup.config.decode.to_dict()}
  if hasattr(setup.tokenizer, "vocab_hash"):
    meta["vocab_hash"] = setup.tokenizer.vocab_hash()
  meta.update(extra or {})
  return meta


@dataclasses.dataclass
class Run:
  """What every training loop starts from."""
  graphdef: nnx.GraphDef
  state: TrainState
  state_shardings: TrainState     # the state's NamedShardings, leaf for leaf
  optimizer: optax.GradientTransformation
  ckpt: Checkpointer | None       # None: a run that saves nothing (the compile command's)
  found: tuple[str, ...] = ()     # what the work directory held before the run wrote to it


def prepare_run(setup: Setup) -> Run:
  """Records the config, builds the optimizer and the sharded train state (from the starting
  weights when there are any) and opens the work directory's checkpoint manager, which records
  the run's settings (`run_settings`) with each checkpoint and checks them on resume."""
  config = setup.config
  settings = run_settings(setup)
  allowed = run_settings_lib.allowed_fields(config.checkpoint.allow_changed, settings)
  found = tuple(sorted(os.listdir(config.workdir))) if os.path.isdir(config.workdir) else ()
  os.makedirs(config.workdir, exist_ok=True)
  if distributed.is_lead_process():
    with open(os.path.join(config.workdir, "config.json"), "w") as f:
      f.write(json.dumps(config.to_dict(), indent=2))
  optimizer = optimizer_of(config_lib.optimizer_config(config), setup.model_cfg)
  graphdef, params = initial_params(setup)
  graphdef, state, state_sh = create_train_state(setup.model_cfg, optimizer, setup.mesh,
                                                 config.seed, params=params,
                                                 with_reference=needs_reference(config))
  ckpt = Checkpointer(os.path.join(config.workdir, "checkpoints"), every=config.checkpoint.every,
                      keep=config.checkpoint.keep, settings=settings, allow_changed=allowed)
  return Run(graphdef, state, state_sh, optimizer, ckpt, found)


def _family_decode_settings(config: RunConfig, family: str) -> dict:
  """{decode.<field>: value} of the decode settings the weights' family declares
  (`Family.config_sections["decode"]`: DiffusionGemma's sampler), resolved by `build_setup`;
  {} for a family that declares none."""
  section = families.get(family).config_sections.get("decode")
  if section is None:
    return {}
  return {f"decode.{f.name}": getattr(config.decode, f.name)
          for f in dataclasses.fields(section)}


def run_settings(setup: Setup) -> dict:
  """{field: resolved value} of every setting that decides what the run's rollouts are and how
  they are replayed and scored, the one table of them: each checkpoint records it and a resume
  compares it (`orl_jax/storage/run_settings.py`). Values are resolved: the weights' family, the
  tokenizer's special ids, the family's block rules, the decode defaults `build_setup` filled
  in. Step counts, logging, checkpointing, batch sizes and the work directory are left out:
  they may change between a run and its resume; so are the ORL sections for the other modes."""
  config, tok, model_cfg = setup.config, setup.tokenizer, setup.model_cfg
  m, task, d, o, r = config.model, config.task, config.decode, config.orl, config.replay
  family = getattr(model_cfg, "hf_family", "")
  rules = _block_rules(config, family)
  loss = config_lib.loss_config(config)
  table = {
      "train.mode": config.train.mode,
      # model and tokenizer identity
      "model.path": m.path or m.init_from,
      "model.hf_family": family,
      "model.residual.mode": m.residual.mode,
      "model.residual.scale": m.residual.scale,
      "model.residual.temperature": m.residual.temperature,
      "model.tokenizer": m.tokenizer,
      "model.vocab_size": model_cfg.vocab_size,
      "tokenizer.vocab_hash": tok.vocab_hash() if hasattr(tok, "vocab_hash") else "",
      "model.special_tokens.mask": getattr(tok, "mask_id", None),
      "model.special_tokens.eos": list(getattr(tok, "eos_ids", (tok.eos_id,))),
      # the prompts
      "task.name": task.name,
      "task.path": task.path,
      "task.chat": task.chat,
      "task.prompt_len": task.prompt_len,
      # how a rollout decodes
      "decode.block_size": d.block_size,
      "decode.gen_length": d.gen_length,
      "decode.block_placement": rules.get("block_placement"),
      "decode.commit_compare": rules.get("commit_compare"),
      "decode.max_steps_per_block": d.max_steps_per_block,
      "decode.edit_threshold": d.edit_threshold,
      "decode.max_post_edit_steps": d.max_post_edit_steps,
      **_family_decode_settings(config, family),
      "orl.rollout_rule": o.rollout_rule,
      "orl.rollout_rule_value": o.rollout_rule_value,
      "orl.rollout_temperature": o.rollout_temperature,
      "orl.group_size": o.group_size,
      "orl.min_reward": o.min_reward,
      # what a rollout captures and how its states are replayed
      "decode.top_k": d.top_k,
      "orl.capture_states": o.capture_states,
      "orl.capture_routes": o.capture_routes,
      "replay.layout": r.layout,
      "replay.states_per_response": r.states_per_response,
      # the loss
      "loss.gate_entropy": loss.gate_entropy,
      "loss.aec_rho": loss.aec_rho,
      "loss.conf_entropy": loss.conf_entropy,
      "loss.kl_cap": loss.kl_cap,
      "loss.w_aec": loss.w_aec,
      "loss.w_kl": loss.w_kl,
      "loss.kl_reference": loss.kl_reference,
  }
  if config.train.mode == "orl":
    return table
  return {k: v for k, v in table.items() if not k.startswith(_ORL_ONLY)}


_ORL_ONLY = ("orl.", "replay.", "loss.")   # settings only an ORL run reads


def _block_rules(config, family: str) -> dict:
  """The block decoder's resolved rules (`decode.from_run.family_rules`); {} for a family that
  decodes with its own sampler."""
  try:
    return from_run.family_rules(config, family)
  except config_lib.ConfigError:
    return {}


def resume(run: Run, data_iter) -> tuple[object, int]:
  """(state, step) from the work directory's newest checkpoint that restores (damaged newer ones
  are moved aside with a warning), restoring `data_iter` in place; the fresh state and step 0
  when there is none. Either is said in one line: `resumed from step K`, or, when the work
  directory held files but no checkpoint (a run stopped before it saved one), that the run
  starts over there."""
  assert run.ckpt is not None   # `prepare_run` opens it
  start, state, _ = run.ckpt.restore_latest(abstract_like(run.state), data_iter)
  if not start:
    if run.found and distributed.is_lead_process():
      workdir = os.path.dirname(run.ckpt.directory)
      shown = ", ".join(run.found[:4]) + (", ..." if len(run.found) > 4 else "")
      print(f"fresh start at step 0 in a non-empty work directory: {workdir} holds {shown} "
            "but no checkpoint to resume, so the run starts over and replaces them", flush=True)
    return run.state, 0
  if distributed.is_lead_process():
    print(f"resumed from step {start} ({run.ckpt.directory})", flush=True)
  return state, start


def finish_run(setup: Setup, run: Run, state, step: int) -> str:
  """Waits for checkpoints and exports the final parameters to WORKDIR/params, and, for a
  model of a registered family, as a Hugging Face directory WORKDIR/hf with its official tensor
  names (process 0 writes; every process returns once the folders are complete)."""
  assert run.ckpt is not None   # `prepare_run` opens it
  run.ckpt.close()
  out = os.path.join(setup.config.workdir, weights_lib.RUN_PARAMS)
  params = sharding_lib.to_host(state.params)   # a collective: every process takes part
  if distributed.is_lead_process():
    hf_dir = weights_lib.hf_dir(setup.config)
    record = trained_run.run_record(setup.config, setup.tokenizer, hf_dir,
                                    export_model_type(setup.config, hf_dir))
    params_io.save_params(out, params, params_meta(setup, {"train_steps": int(step),
                                                       "seed": setup.config.seed,
                                                       "mode": setup.config.train.mode,
                                                       trained_run.RUN_KEY: record}),
                          lambda folder: trained_run.save_tokenizer(setup.tokenizer, folder))
    if setup.model_cfg.hf_family:
      export_hf_dir(setup, params, os.path.join(setup.config.workdir, HF_EXPORT_DIR))
  distributed.barrier("export_params")
  return out


HF_EXPORT_DIR = "hf"   # WORKDIR/hf: the final parameters as a Hugging Face directory


def export_model_type(config, hf_dir: str = "") -> str:
  """The config.json `model_type` an export of the run declares: the Hugging Face directory's it
  started from, else `model.hf_model_type`, else '' (its family's own)."""
  if hf_dir:
    from orl_jax.models import hf_read
    return hf_read.read_hf_config(hf_dir).get("model_type", "")
  return config.model.hf_model_type


def export_hf_dir(setup: Setup, params, out_dir: str, max_shard_bytes: int = 0) -> str:
  """Writes `params` as a Hugging Face directory of the run's family: weights, config.json
  (declaring the authors' classes where transformers has none, `Family.remote_code`, and the
  residual pathway), the tokenizer files and, from the directory the run started from, its
  generation_config.json and modeling code (`export_files`)."""
  from orl_jax.models import hf_read, hf_write
  if not setup.model_cfg.hf_family:
    raise config_lib.ConfigError("export: the model belongs to no Hugging Face family; set "
                                 "model.hf_family (or model.path to a Hugging Face directory)")
  source = weights_lib.hf_dir(setup.config)
  family = setup.model_cfg.hf_family
  files, texts = export_files(setup, source)
  extra = dict(_special_token_ids(setup), **_residual_record(setup.model_cfg))
  return hf_write.export_hf(out_dir, params, setup.model_cfg, family,
                            max_shard_bytes=max_shard_bytes, extra_config=extra,
                            passthrough=hf_read.read_passthrough(source, family),
                            model_type=export_model_type(setup.config, source), files=files,
                            texts=texts)


def export_files(setup: Setup, source: str) -> tuple[dict, dict]:
  """({name: path to copy}, {name: text}) of an export besides its weights and config.json:
  tokenizer.json (the run's tokenizer file, else written from the tokenizer),
  tokenizer_config.json and special_tokens_map.json naming the run's special tokens, and from
  the Hugging Face directory `source` ('' = none) its other tokenizer files, its
  generation_config.json (with the run's special-token ids) and its `*.py` modeling code."""
  from orl_jax.data import hf_tokenizer
  from orl_jax.models import hf_read
  tok = setup.tokenizer
  files, texts = {}, {}
  tok_file = getattr(tok, "source", "")
  if os.path.isfile(tok_file):
    files[trained_run.TOKENIZER_FILE] = tok_file
  else:
    texts[trained_run.TOKENIZER_FILE] = hf_tokenizer.tokenizer_json(tok)
  if source:
    for name in sorted(os.listdir(source)):
      if name.endswith(".py") or name in hf_tokenizer.TOKENIZER_SIDE_FILES:
        files[name] = os.path.join(source, name)
  side = os.path.join(source, hf_tokenizer.TOKENIZER_CONFIG_FILE) if source else ""
  texts.update(hf_tokenizer.tokenizer_configs(
      tok, hf_read.read_json_object(side) if os.path.isfile(side) else None))
  generation = os.path.join(source, hf_read.GENERATION_CONFIG_FILE) if source else ""
  if os.path.isfile(generation):
    config = dict(hf_read.read_json_object(generation), **_special_token_ids(setup))
    texts[hf_read.GENERATION_CONFIG_FILE] = json.dumps(config, indent=2)
  return files, texts


def _residual_record(model_cfg) -> dict:
  """config.json's record of the residual pathway a model has (read back by
  `trained_run.trained_settings`); {} without one."""
  from orl_jax.models import hf_read
  mode = getattr(model_cfg, "residual_mode", "none")
  if mode == "none":
    return {}
  return {trained_run.RESIDUAL_KEY: {
      "mode": mode, "hidden": model_cfg.residual_hidden, "scale": model_cfg.residual_scale,
      "temperature": model_cfg.residual_temperature,
      "file": hf_read.ADAPTER_FILE if mode == "adapter" else ""}}


def _special_token_ids(setup: Setup) -> dict:
  """The run's EOS and pad ids as config.json keys (so the exported directory declares the
  tokens it was trained with); {} for a family with its own config (it writes them itself)."""
  if families.get(setup.model_cfg.hf_family).own_model:
    return {}
  tok = setup.tokenizer
  eos = list(getattr(tok, "eos_ids", (tok.eos_id,)))
  ids = {"eos_token_id": eos[0] if len(eos) == 1 else eos, "pad_token_id": tok.pad_id}
  bos = getattr(tok, "bos_id", None)
  return ids if bos is None else dict(ids, bos_token_id=bos)


class RunLog:
  """The progress bar and the metrics file of a loop that runs steps (start, last]; `last` is
  `train.steps`, or `stop_after` when a test ends the run early (a simulated kill)."""

  def __init__(self, setup: Setup, start: int, desc: str, *, progress: bool = True,
               stop_after: int | None = None):
    tc = setup.config.train
    self.log_every = tc.log_every
    self.last = tc.steps if stop_after is None else min(tc.steps, stop_after)
    self.writer = MetricsWriter(setup.config.workdir, resume_step=start)
    self.bar = tqdm(total=tc.steps, initial=start, desc=desc, dynamic_ncols=True,
                    disable=not (progress and distributed.is_lead_process()))

  def due(self, step: int) -> bool:
    """Counts the step done; True when its metrics are to be written."""
    self.bar.update(1)
    return step % self.log_every == 0 or step == self.last

  def write(self, step: int, metrics: dict) -> dict:
    return self.writer.write(step, metrics)

  def close(self) -> None:
    self.bar.close()
    self.writer.close()
