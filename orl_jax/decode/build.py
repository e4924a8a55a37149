"""One constructor for every decoder (docs/decoding.md#one-denoising-step,
docs/method.md#rollout-with-exact-state-capture, docs/decoding.md#two-forward-counts):
`make_decoder`.

Every model decodes through its family's sampler (`sampler_of`: `Family.sampler`, by default
the block-diffusion samplers of `orl_jax.decode.block_sampler`, lock-step or per-row by
`decode.schedule`; DiffusionGemma's uniform-noise sampler lives in its own folder). The
interface is `orl_jax.decode.sampler.Sampler`; nothing here knows which family it serves.

A purpose says what the decoder is for:

* "evaluate": jitted `(params, prompt_tokens [B, P], prompt_valid [B, P], key) ->
  models.decoded.DecodeOutput` without capture (a `queued` sampler: the same signature over a
  queue of B prompts decoded on `n_rows` rows, with `DecodeOutput.iterations` set);
* "decode": the same with every state captured (the launcher's trajectory page);
* "rollout": jitted `(params, prompt_tokens [P, Lp], prompt_valid, key, rollout_step) ->
  models.decoded.Trajectories`, `group_size` responses per prompt with exact state capture, the
  sampler's per-shard rollout run data-parallel over `mesh`
  (`orl_jax.decode.trajectories.make_trajectories`).
"""
from __future__ import annotations

from orl_jax.decode import trajectories
from orl_jax.decode.block_sampler import PerRowSampler, block_sampler
from orl_jax.decode.sampler import PURPOSES, Sampler
from orl_jax.models import families
from orl_jax.unmasking import UnmaskRule


def sampler_of(config, model_cfg=None, family: str | None = None) -> Sampler:
  """The sampler that decodes `model_cfg` under `config`: its family's (`Family.sampler`), else
  the block sampler of `decode.schedule`. `family` names the registry family where there is
  no model config yet (the tokenizer's set-up)."""
  entry = families.get(family) if family is not None else families.of_model(model_cfg)
  return (entry.sampler or block_sampler)(config, model_cfg)


def make_decoder(config, model_cfg, graphdef, purpose: str, *, mask_id: int, eos_id: int,
                 rule: UnmaskRule | None = None, temperature: float | None = None,
                 group_size: int = 1, n_rows: int = 0, mesh=None):
  """The jitted decoder of `model_cfg`'s sampler for `purpose` (module docstring). `rule` /
  `temperature`: the setting evaluated (None: `decode.rule` / `decode.temperature`);
  `group_size` and `mesh`: a rollout's responses per prompt and data-parallel mesh; `n_rows`:
  a queued sampler's rows ("evaluate")."""
  if purpose not in PURPOSES:
    raise ValueError(f"decoder purpose {purpose!r} must be one of {PURPOSES}")
  sampler = sampler_of(config, model_cfg)
  if purpose == "rollout":
    rollout_fn, cfg = sampler.rollout(mask_id=mask_id, eos_id=eos_id, mesh=mesh)
    return trajectories.make_trajectories(graphdef, cfg, group_size, mesh, rollout_fn=rollout_fn)
  return sampler.decoder(graphdef, purpose, mask_id=mask_id, eos_id=eos_id, rule=rule,
                         temperature=temperature, n_rows=n_rows)


def segmented_rollout(config, model_cfg, graphdef, *, mask_id: int, eos_id: int,
                      group_size: int, mesh, iterations: int):
  """The rollout of `model_cfg`'s sampler in segments of `iterations` loop iterations
  (`trajectories.SegmentedRollout`: the host sees responses as their rows retire), or None
  where the rollout is not the per-row engine's (the lock-step and DiffusionGemma rollouts
  finish every row together)."""
  sampler = sampler_of(config, model_cfg)
  if not isinstance(sampler, PerRowSampler):
    return None
  _, cfg = sampler.rollout(mask_id=mask_id, eos_id=eos_id, mesh=mesh)   # checks rows and mesh
  return trajectories.SegmentedRollout(graphdef, cfg, group_size, config.orl.rollout_rows,
                                       iterations, mesh, config.orl.prefill_once)
