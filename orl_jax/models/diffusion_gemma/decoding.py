"""DiffusionGemma's `Sampler` (`orl_jax.decode.sampler`): its uniform-noise sampler
(`sampler.py`) behind the interface every decoder shares.

What differs from the block samplers: undecided positions hold uniform random tokens (no mask
token); a captured step's unresolved positions are those it did not accept (`Capture.commit`
False), since accepted tokens can be re-noised later; replay rows carry a token-causal context
stream (the committed text the encoder cached); the response's canvases start at the prompt's
end (lead 0, `prompt_end`); and its decode is sized and priced whole (no block `DecodeConfig`).
It samples with its own temperature schedule (decode.t_max -> decode.t_min), so no temperature
is taken, and accepts by an entropy bound only.
"""
from __future__ import annotations

from typing import Final

from orl_jax.models.diffusion_gemma import trajectories as dg_trajectories
from orl_jax.models.diffusion_gemma import sampler as dg_sampler
from orl_jax.unmasking import UnmaskRule


def not_accepted(state_tokens, commit, mask_id: int):
  """The positions a captured step did not accept (`Sampler.unresolved` of DiffusionGemma)."""
  return ~commit


class UniformNoiseSampler:
  """The `Sampler` of a `DiffusionGemmaConfig` (`model_cfg`: eos and pad ids)."""

  needs_mask_token = False
  queued = False
  replay_context: Final = "token"
  block_placement: Final = "prompt_end"

  def __init__(self, config, model_cfg=None):
    self.config, self.model_cfg = config, model_cfg

  def _sampler_config(self, **kw) -> dg_sampler.SamplerConfig:
    if self.config.decode.schedule == "per_row":
      raise ValueError("decode.schedule='per_row' runs the block decoder; diffusion_gemma "
                       "models decode with their family's own sampler: set "
                       "decode.schedule='lockstep'")
    cfg = self.model_cfg
    return dg_sampler.sampler_config(self.config, eos_ids=cfg.eos_ids, pad_id=cfg.pad_id, **kw)

  def decoder(self, graphdef, purpose: str, *, mask_id: int, eos_id: int,
              rule: UnmaskRule | None = None, temperature: float | None = None,
              n_rows: int = 0):
    """The sampler whose entropy bound (nats) is the setting's `entropy_budget_<bound>`."""
    d = self.config.decode
    if d.schedule == "per_row":
      self._sampler_config()     # names the schedule before the rule
    rule = rule or UnmaskRule(d.rule, d.rule_value)
    if rule.name != "entropy_budget":
      where = "eval.settings" if purpose == "evaluate" else "decode.rule"
      raise ValueError(f"{where}: {rule.label!r} is not a DiffusionGemma decoder; its sampler "
                       "accepts by an entropy bound: use 'entropy_budget_<nats>' "
                       "(transformers' default 0.1)")
    cfg = self._sampler_config(rollout=False, entropy_bound=rule.value)
    return dg_trajectories.sampler_decoder(graphdef, cfg, capture=purpose == "decode")

  def rollout(self, *, mask_id: int, eos_id: int, mesh=None):
    """With capture and the rollout rule's bound (`orl.rollout_rule_value`)."""
    rows = self.config.orl.rollout_rows
    if rows and self.config.decode.schedule != "per_row":
      raise ValueError(f"orl.rollout_rows={rows} sets the per-row engine's rows, but "
                       "diffusion_gemma models roll out with their family's own sampler: set "
                       "orl.rollout_rows=0")
    if self.config.orl.prefill_once:
      raise ValueError("orl.prefill_once prefills the block decoder's prompts once; "
                       "diffusion_gemma models roll out with their family's own sampler: set "
                       "orl.prefill_once=False")
    return dg_trajectories.sampler_trajectories, self._sampler_config()

  unresolved = staticmethod(not_accepted)

  def forward_config(self, purpose: str, *, mask_id: int, eos_id: int):
    return None


def make_sampler(config, model_cfg=None) -> UniformNoiseSampler:
  """`Family.sampler` of DiffusionGemma."""
  return UniformNoiseSampler(config, model_cfg)
