"""The optimizer section of a run: `OptimizerConfig` (built once from `config.train` and the
residual pathway's learning-rate scale by `orl_jax.config.derive.optimizer_config`, validating
itself) and `make_optimizer` (AdamW with linear warm-up and cosine decay, global-norm
clipping, a learning rate of its own for the residual pathway, frozen parameters left
alone), with `optimizer_of`, the optimizer of a model: its family's frozen parameters
(`frozen_params`) and residual-pathway modules."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence, cast

import jax
import optax

from orl_jax import sharding as sharding_lib
from orl_jax.models import families
from orl_jax.models.family_base import AnyModelConfig
from orl_jax.models.moe import frozen_param
from orl_jax.models.transformer import ModelConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
  """What the optimizer of a run needs (`orl_jax.config.derive.optimizer_config` reads it from
  the run config, whose `train` section holds the defaults; none here); `errors` says what is
  wrong."""
  lr: float                       # train.lr: the peak learning rate
  steps: int                      # train.steps: the cosine decay's length
  warmup_steps: int               # train.warmup_steps: linear warm-up from 0
  final_lr_fraction: float        # train.final_lr_fraction: the decay ends at lr x this
  b1: float
  b2: float
  weight_decay: float             # AdamW's decoupled weight decay
  grad_clip: float                # global-norm clipping (0 = off)
  residual_lr_scale: float        # model.residual.lr_scale: the residual pathway's learning
                                  # rate is lr x this (docs/method.md#the-residual-pathway)
  freeze_base: bool               # train.freeze_base: only the residual pathway trains

  def errors(self) -> list[str]:
    """Every problem of the section, one sentence each naming the config field."""
    checks = (
        (self.lr > 0, f"train.lr={self.lr} must be positive"),
        (self.steps >= 0, f"train.steps={self.steps} must be >= 0"),
        (self.warmup_steps >= 0, f"train.warmup_steps={self.warmup_steps} must be >= 0"),
        (max(self.warmup_steps, 1) < max(self.steps, 2),
         f"train.warmup_steps={self.warmup_steps} must be below train.steps={self.steps} (the "
         "cosine decay after the warmup needs at least one step)"),
        (0 <= self.final_lr_fraction <= 1,
         f"train.final_lr_fraction={self.final_lr_fraction} must be in [0, 1]"),
        (0 <= self.b1 < 1 and 0 <= self.b2 < 1,
         f"train.b1={self.b1} and train.b2={self.b2} must be in [0, 1)"),
        (self.weight_decay >= 0, f"train.weight_decay={self.weight_decay} must be >= 0"),
        (self.grad_clip >= 0, f"train.grad_clip={self.grad_clip} must be >= 0 (0 = off)"),
        (self.residual_lr_scale >= 0,
         f"model.residual.lr_scale={self.residual_lr_scale} must be >= 0"),
    )
    return [message for ok, message in checks if not ok]


def param_labels(params, frozen: Callable[[str], bool] | None = None, *,
                 residual_modules: Sequence[str]) -> Any:
  """'residual' for the residual pathway's parameters (under a module named in
  `residual_modules`, the model family's: `Family.residual_modules`), 'frozen' for those
  `frozen(name)` marks (never updated), 'base' for everything else."""
  def label(path, _):
    if frozen is not None and frozen(sharding_lib.path_name(path)):
      return "frozen"
    return "residual" if any(getattr(k, "key", k) in residual_modules for k in path) else "base"
  return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(cfg: OptimizerConfig, frozen: Callable[[str], bool] | None = None, *,
                   residual_modules: Sequence[str]):
  """AdamW with linear warmup and cosine decay, global-norm clipping (`grad_clip` > 0), and
  the residual pathway (the modules `residual_modules` names: `Family.residual_modules`,
  `optimizer_of`) at `lr * residual_lr_scale`. Parameters `frozen(name)` marks get
  no update and no optimizer state (`frozen_params`); with `freeze_base`, only the
  residual pathway is updated."""
  def schedule(scale):
    return optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr * scale, max(cfg.warmup_steps, 1), max(cfg.steps, 2),
        end_value=cfg.lr * scale * cfg.final_lr_fraction)

  def adamw(scale):
    return optax.adamw(schedule(scale), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)

  base = optax.set_to_zero() if cfg.freeze_base else adamw(1.0)
  transforms = {"base": base, "residual": adamw(cfg.residual_lr_scale)}
  if frozen is not None:
    transforms["frozen"] = optax.set_to_zero()
  update = optax.multi_transform(transforms, functools.partial(
      param_labels, frozen=frozen, residual_modules=tuple(residual_modules)))
  if cfg.grad_clip <= 0:
    return update
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), update)


def frozen_params(model_cfg: AnyModelConfig) -> Callable[[str], bool] | None:
  """The predicate on parameter names the optimizer must leave alone (an MoE router's
  `expert_bias`, a frozen router; a family's own, such as DiffusionGemma's `layer_scalar`
  buffers), or None when the model has none."""
  family = families.of_model(model_cfg)
  if family.frozen is not None:
    return family.frozen
  model_cfg = cast(ModelConfig, model_cfg)   # a family with its own model names its `frozen`
  if model_cfg.moe is None:
    return None
  return functools.partial(frozen_param, cfg=model_cfg.moe)


def optimizer_of(cfg: OptimizerConfig, model_cfg: AnyModelConfig):
  """The optimizer of `cfg` (`orl_jax.config.derive.optimizer_config` of a run) for a model of
  `model_cfg`: its family's frozen parameters and residual-pathway modules."""
  return make_optimizer(cfg, frozen_params(model_cfg),
                        residual_modules=families.of_model(model_cfg).residual_modules)
