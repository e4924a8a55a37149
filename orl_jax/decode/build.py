"""One constructor for every decoder (DESIGN §2.2, §2.3, §6): `make_decoder`.

Three samplers decode our models, picked by the model's kind (`sampler_kind`), never by the
caller:

* the lock-step block decoder (`orl_jax.decode.lockstep`): mask-diffusion families, every row
  of a batch steps together (`decode.schedule = "lockstep"`);
* the per-row engine (`orl_jax.decode.per_row`): the same denoising, each row refilled from a
  queue as soon as its response ends (`decode.schedule = "per_row"`);
* the uniform-noise sampler of DiffusionGemma (`orl_jax.models.diffusion_gemma.sampler`), for
  a family whose undecided positions hold random tokens (`Family.noise == "uniform"`).

A purpose says what the decoder is for:

* "evaluate": jitted `(params, prompt_tokens [B, P], prompt_valid [B, P], key) ->
  decode.types.DecodeOutput` without capture (the per-row engine: the same signature over a queue
  of B prompts decoded on `n_rows` rows, with `DecodeOutput.iterations` set);
* "decode": the same with every state captured (the launcher's trajectory page); always the
  lock-step decoder for the mask families;
* "rollout": jitted `(params, prompt_tokens [P, Lp], prompt_valid, key, rollout_step) ->
  decode.types.Trajectories`, `group_size` responses per prompt with exact state capture.
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from orl_jax import config as config_lib
from orl_jax import rollout as rollout_lib
from orl_jax import sharding as sharding_lib
from orl_jax.decode import lockstep, per_row, placement
from orl_jax.decode.config import DecodeConfig
from orl_jax.models import families
from orl_jax.models.diffusion_gemma import rollout as dg_rollout
from orl_jax.models.diffusion_gemma import sampler as dg_sampler
from orl_jax.models.diffusion_gemma.config import DiffusionGemmaConfig
from orl_jax.unmasking import UnmaskRule

PURPOSES = ("evaluate", "decode", "rollout")
LOCKSTEP, PER_ROW, UNIFORM_NOISE = "lockstep", "per_row", "uniform_noise"


def sampler_kind(config, model_cfg) -> str:
  """The sampler a model decodes with: UNIFORM_NOISE for a family whose undecided positions
  hold random tokens (`Family.noise`; DiffusionGemma), else the block decoder of
  `decode.schedule` (LOCKSTEP or PER_ROW)."""
  if families.of_model(model_cfg).noise == "uniform":
    return UNIFORM_NOISE
  return PER_ROW if config.decode.schedule == PER_ROW else LOCKSTEP


def _registry_family(model_cfg) -> str | None:
  """The weights' registry family (decides the block decoder's rules); None without a model
  config (then `model.hf_family`)."""
  return None if model_cfg is None else getattr(model_cfg, "hf_family", "")


def block_decode_config(config, model_cfg, purpose: str, *, mask_id: int, eos_id: int,
                        rule: UnmaskRule | None = None,
                        temperature: float | None = None) -> DecodeConfig:
  """The block decoder's config for `purpose`. A rollout decodes with the rollout rule and
  temperature, capture on, and always stops a row after the block in which it committed EOS
  (the blocks after it change no token of the response, and their states would train on tokens
  the response does not hold); "decode" captures every state; "evaluate" captures none."""
  family = _registry_family(model_cfg)
  if purpose == "rollout":
    o = config.orl
    decode_cfg = config_lib.decode_config(config, mask_id=mask_id, eos_id=eos_id,
                                          rule=UnmaskRule(o.rollout_rule, o.rollout_rule_value),
                                          temperature=o.rollout_temperature, capture_states=1,
                                          family=family)
    steps = decode_cfg.max_blocks * decode_cfg.steps_bound
    return dataclasses.replace(decode_cfg, capture_states=o.capture_states or steps,
                               capture_routes=o.capture_routes, eos_early_stop=True)
  decode_cfg = config_lib.decode_config(config, mask_id=mask_id, eos_id=eos_id, rule=rule,
                                        temperature=temperature, family=family)
  if purpose == "decode":
    decode_cfg = dataclasses.replace(
        decode_cfg, capture_states=decode_cfg.max_blocks * decode_cfg.steps_bound)
  return decode_cfg


def make_decoder(config, model_cfg, graphdef, purpose: str, *, mask_id: int, eos_id: int,
                 rule: UnmaskRule | None = None, temperature: float | None = None,
                 group_size: int = 1, n_rows: int = 0, mesh=None):
  """The jitted decoder of `model_cfg`'s kind for `purpose` (module docstring). `rule` /
  `temperature`: the setting evaluated (None: `decode.rule` / `decode.temperature`);
  `group_size` and `mesh`: a rollout's responses per prompt and data-parallel mesh; `n_rows`:
  the per-row engine's rows ("evaluate")."""
  if purpose not in PURPOSES:
    raise ValueError(f"decoder purpose {purpose!r} must be one of {PURPOSES}")
  kind = sampler_kind(config, model_cfg)
  if kind == UNIFORM_NOISE:
    return _uniform_noise_decoder(config, model_cfg, graphdef, purpose, rule, group_size, mesh)
  decode_cfg = block_decode_config(config, model_cfg, purpose, mask_id=mask_id, eos_id=eos_id,
                                   rule=rule, temperature=temperature)
  if purpose == "rollout":
    return rollout_lib.make_rollout(graphdef, decode_cfg, group_size, mesh,
                                    rollout_fn=_per_row_rollout_fn(config, mesh))
  if kind == PER_ROW and purpose == "evaluate":
    return per_row.make_engine(graphdef, decode_cfg, n_rows)
  return lockstep.lockstep_decoder(graphdef, decode_cfg)


def _per_row_rollout_fn(config, mesh):
  """`decode.schedule = "per_row"`: the per-row rollout on `orl.rollout_rows` rows (0: one
  per response); None: the lock-step rollout."""
  if config.decode.schedule != PER_ROW:
    return None
  rows = config.orl.rollout_rows
  if rows and mesh is not None and sharding_lib.n_batch_shards(mesh.shape) > 1:
    raise ValueError(f"orl.rollout_rows={rows} decodes the rollout queue on one batch shard: "
                     "set mesh.data = mesh.fsdp = mesh.expert = 1, or orl.rollout_rows=0")
  return functools.partial(rollout_lib.per_row_rollout, n_rows=rows)


def _uniform_noise_decoder(config, cfg: DiffusionGemmaConfig, graphdef, purpose: str,
                           rule: UnmaskRule | None, group_size: int, mesh):
  """DiffusionGemma's sampler: with capture for a rollout (its rollout rule), else whose
  entropy bound (nats) is the setting's `entropy_budget_<bound>`; it samples with its own
  temperature schedule (decode.t_max -> decode.t_min), so no temperature is taken."""
  if config.decode.schedule == PER_ROW:
    raise ValueError("decode.schedule='per_row' runs the block decoder; diffusion_gemma models "
                     "decode with their family's own sampler: set decode.schedule='lockstep'")
  if purpose == "rollout":
    if config.orl.rollout_rows:
      raise ValueError(f"orl.rollout_rows={config.orl.rollout_rows} sets the per-row engine's "
                       "rows, but diffusion_gemma models roll out with their family's own "
                       "sampler: set orl.rollout_rows=0")
    sampler_cfg = dg_sampler.sampler_config(config, eos_ids=cfg.eos_ids, pad_id=cfg.pad_id)
    return rollout_lib.make_rollout(graphdef, sampler_cfg, group_size, mesh,
                                    rollout_fn=dg_rollout.rollout)
  rule = rule or UnmaskRule(config.decode.rule, config.decode.rule_value)
  if rule.name != "entropy_budget":
    where = "eval.settings" if purpose == "evaluate" else "decode.rule"
    raise ValueError(f"{where}: {rule.label!r} is not a DiffusionGemma decoder; its sampler "
                     "accepts by an entropy bound: use 'entropy_budget_<nats>' (transformers' "
                     "default 0.1)")
  sampler_cfg = dg_sampler.sampler_config(config, eos_ids=cfg.eos_ids, pad_id=cfg.pad_id,
                                          rollout=False, entropy_bound=rule.value)
  return dg_rollout.sampler_decoder(graphdef, sampler_cfg, capture=purpose == "decode")


def prompt_lead(config, model_cfg, prompt_valid, *, mask_id: int, eos_id: int):
  """[B] int32 prompt tokens that open each row's first decoded block (the block decoder with
  absolute placement, `placement.prompt_lead`); 0 for the uniform-noise sampler."""
  if sampler_kind(config, model_cfg) == UNIFORM_NOISE:
    return jnp.zeros(prompt_valid.shape[:1], jnp.int32)
  decode_cfg = block_decode_config(config, model_cfg, "decode", mask_id=mask_id, eos_id=eos_id)
  return placement.prompt_lead(prompt_valid, decode_cfg.block_size, decode_cfg.block_placement)
