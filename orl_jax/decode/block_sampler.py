"""The block-diffusion samplers (docs/decoding.md#one-denoising-step,
docs/method.md#rollout-with-exact-state-capture), the `Sampler` of every mask-diffusion family
(`Family.sampler` None): undecided positions hold the mask token and blocks are denoised one after
another.

* `LockstepSampler` (`decode.schedule = "lockstep"`): every row of a batch steps together
  (`orl_jax.decode.lockstep`);
* `PerRowSampler` (`decode.schedule = "per_row"`): the same denoising, each row refilled from a
  queue as soon as its response ends (`orl_jax.decode.per_row`); its "decode" purpose (every
  state captured for the trajectory page) stays the lock-step decoder.

Both read the block rules (`block_placement`, `commit_compare`) of the weights' registry family
(`decode.from_run.family_rules`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Final

from orl_jax import sharding as sharding_lib
from orl_jax.decode import from_run, lockstep, per_row
from orl_jax.decode import trajectories
from orl_jax.decode.capture import masked_positions
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.sampler import BlockPlacement, DecodeFn, RolloutFn
from orl_jax.unmasking import UnmaskRule

PER_ROW = "per_row"


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
    decode_cfg = from_run.decode_config(config, mask_id=mask_id, eos_id=eos_id,
                                          rule=UnmaskRule(o.rollout_rule, o.rollout_rule_value),
                                          temperature=o.rollout_temperature, capture_states=1,
                                          family=family)
    steps = decode_cfg.max_blocks * decode_cfg.steps_bound
    return dataclasses.replace(decode_cfg, capture_states=o.capture_states or steps,
                               capture_routes=o.capture_routes, eos_early_stop=True)
  decode_cfg = from_run.decode_config(config, mask_id=mask_id, eos_id=eos_id, rule=rule,
                                        temperature=temperature, family=family)
  if purpose == "decode":
    decode_cfg = dataclasses.replace(
        decode_cfg, capture_states=decode_cfg.max_blocks * decode_cfg.steps_bound)
  return decode_cfg


class LockstepSampler:
  """The lock-step block decoder: every purpose decodes a batch whose rows step together."""

  needs_mask_token = True
  queued = False
  replay_context: Final = "block"   # block-causal context: a state sees the clean blocks before it

  def __init__(self, config, model_cfg=None):
    self.config, self.model_cfg = config, model_cfg

  @property
  def block_placement(self) -> BlockPlacement:
    return from_run.family_rules(self.config,
                                   _registry_family(self.model_cfg))["block_placement"]

  def forward_config(self, purpose: str, *, mask_id: int, eos_id: int,
                     rule: UnmaskRule | None = None,
                     temperature: float | None = None) -> DecodeConfig:
    return block_decode_config(self.config, self.model_cfg, purpose, mask_id=mask_id,
                               eos_id=eos_id, rule=rule, temperature=temperature)

  def decoder(self, graphdef, purpose: str, *, mask_id: int, eos_id: int,
              rule: UnmaskRule | None = None, temperature: float | None = None,
              n_rows: int = 0) -> DecodeFn:
    cfg = self.forward_config(purpose, mask_id=mask_id, eos_id=eos_id, rule=rule,
                              temperature=temperature)
    return lockstep.lockstep_decoder(graphdef, cfg)

  def rollout(self, *, mask_id: int, eos_id: int,
              mesh=None) -> tuple[RolloutFn, DecodeConfig]:
    rollout: RolloutFn = trajectories.lockstep_trajectories
    if self.config.orl.prefill_once:
      rollout = functools.partial(trajectories.lockstep_trajectories, prefill_once=True)
    return rollout, self.forward_config("rollout", mask_id=mask_id, eos_id=eos_id)

  unresolved = staticmethod(masked_positions)


class PerRowSampler(LockstepSampler):
  """The per-row engine: evaluation decodes a queue of prompts on `n_rows` rows, a rollout its
  P*G responses on `orl.rollout_rows` rows (0: one per response)."""

  queued = True

  def decoder(self, graphdef, purpose: str, *, mask_id: int, eos_id: int,
              rule: UnmaskRule | None = None, temperature: float | None = None,
              n_rows: int = 0) -> DecodeFn:
    if purpose != "evaluate":
      return super().decoder(graphdef, purpose, mask_id=mask_id, eos_id=eos_id, rule=rule,
                             temperature=temperature)
    cfg = self.forward_config(purpose, mask_id=mask_id, eos_id=eos_id, rule=rule,
                              temperature=temperature)
    return per_row.make_engine(graphdef, cfg, n_rows)

  def rollout(self, *, mask_id: int, eos_id: int,
              mesh=None) -> tuple[RolloutFn, DecodeConfig]:
    rows = self.config.orl.rollout_rows
    if rows and mesh is not None and sharding_lib.n_batch_shards(mesh.shape) > 1:
      raise ValueError(f"orl.rollout_rows={rows} decodes the rollout queue on one batch shard: "
                       "set mesh.data = mesh.fsdp = mesh.expert = 1, or orl.rollout_rows=0")
    rollout = functools.partial(trajectories.per_row_trajectories, n_rows=rows)
    if self.config.orl.prefill_once:
      rollout = functools.partial(rollout, prefill_once=True)
    return rollout, self.forward_config("rollout", mask_id=mask_id, eos_id=eos_id)


def block_sampler(config, model_cfg=None) -> LockstepSampler:
  """The block sampler of `decode.schedule`."""
  return (PerRowSampler if config.decode.schedule == PER_ROW else LockstepSampler)(config,
                                                                                   model_cfg)
