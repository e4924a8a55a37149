"""The optimizer section (`orl_jax/optimizer.py`): built from a run config, validating itself,
the residual pathway's learning-rate scale, clipping off at 0, frozen and base-frozen params."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import tiny
from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax.optimizer import OptimizerConfig, make_optimizer, param_labels

BASE = OptimizerConfig(lr=1e-2, steps=10, warmup_steps=1, final_lr_fraction=0.0, b1=0.9, b2=0.99,
                       weight_decay=0.0, grad_clip=1.0, residual_lr_scale=1.0, freeze_base=False)


def _params():
  w = jnp.asarray([[0.5, -1.0], [2.0, 0.25]], jnp.float32)
  return {"adapter": {"w": w}, "mlp": {"w": w}, "router": {"expert_bias": w}}


def _updates(cfg, grads_scale=1.0, frozen=None, n=3):
  params = _params()
  grads = {k: {kk: grads_scale * jnp.ones_like(v) for kk, v in d.items()}
           for k, d in params.items()}
  opt = make_optimizer(cfg, frozen=frozen, residual_modules=("adapter",))
  state = opt.init(params)
  for _ in range(n):                      # past the warm-up's first (zero) learning rate
    updates, state = opt.update(grads, state, params)
  return updates, state


def test_from_config_reads_train_and_the_residual_lr_scale():
  c = tiny.get_config()
  cfg = config_lib.optimizer_config(run_config.convert(c))
  assert (cfg.lr, cfg.steps, cfg.warmup_steps, cfg.grad_clip) == (
      c.train.lr, c.train.steps, c.train.warmup_steps, c.train.grad_clip)
  assert cfg.residual_lr_scale == c.model.residual.lr_scale
  assert cfg.errors() == []


def test_errors_are_gathered_and_name_the_fields():
  bad = dataclasses.replace(BASE, lr=0.0, final_lr_fraction=2.0, b2=1.0, grad_clip=-1.0,
                            residual_lr_scale=-0.5)
  errors = bad.errors()
  assert len(errors) == 5
  for field in ("train.lr", "train.final_lr_fraction", "train.b2", "train.grad_clip",
                "model.residual.lr_scale"):
    assert any(field in e for e in errors), field
  c = tiny.get_config()
  c.train.lr, c.model.residual.lr_scale = -1.0, -2.0
  with pytest.raises(config_lib.ConfigError) as e:
    run_config.build(c)
  assert "train.lr=-1.0" in str(e.value) and "model.residual.lr_scale=-2.0" in str(e.value)


def test_residual_pathway_moves_at_its_scale():
  updates, _ = _updates(dataclasses.replace(BASE, residual_lr_scale=0.25))
  base, residual = np.asarray(updates["mlp"]["w"]), np.asarray(updates["adapter"]["w"])
  assert np.abs(base).min() > 1e-4                       # the base moves
  np.testing.assert_allclose(residual, 0.25 * base, rtol=1e-5)


def test_grad_clip_zero_is_off():
  """Clipping to a global norm of 0 would scale every gradient to 0 and nothing would train;
  0 means no clipping (adam's first steps move each parameter by about lr)."""
  updates, _ = _updates(dataclasses.replace(BASE, grad_clip=0.0), n=2)
  for u in (updates["mlp"]["w"], updates["adapter"]["w"]):
    assert float(jnp.abs(u).min()) > 0.1 * BASE.lr / 10


def test_frozen_and_freeze_base():
  frozen = lambda name: name.endswith("expert_bias")
  labels = param_labels(_params(), frozen, residual_modules=("adapter",))
  assert labels == {"adapter": {"w": "residual"}, "mlp": {"w": "base"},
                    "router": {"expert_bias": "frozen"}}
  updates, _ = _updates(dataclasses.replace(BASE, freeze_base=True), frozen=frozen)
  assert float(jnp.abs(updates["mlp"]["w"]).max()) == 0.0
  assert float(jnp.abs(updates["router"]["expert_bias"]).max()) == 0.0
  assert float(jnp.abs(updates["adapter"]["w"]).min()) > 0.0
  assert optax.global_norm(updates["adapter"]) > 0
