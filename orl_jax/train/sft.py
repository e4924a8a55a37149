"""Masked-diffusion SFT, the residual warm-up and offline RCD (docs/method.md#the-residual-pathway,
docs/method.md#the-on-policy-loop): one loop over the block-diffusion layout
(`packed_batch.sft_batch`) trained with the 1/t-weighted masked CE (`losses.sft_loss`). The three
modes differ only in the residual fed at the noised tokens: none (SFT), the model's own first pass
(the warm-up), a frozen reference's (offline RCD, `rcd.py`).

One obvious loop: data -> jitted step -> metrics -> checkpoint. The step RNG is
`fold_in(base_key, step)`, the data stream is a pure function of the iterator state, and both
are checkpointed, so a killed run resumes exactly.
"""
from __future__ import annotations

import time
from typing import Any, cast

import jax
import jax.numpy as jnp

from orl_jax import sharding as sharding_lib
from orl_jax.decode import build as decode_build
from orl_jax.packed_batch import SftBatch, masked_state_tokens
from orl_jax.data.pipeline import SftExample, train_dataset
from orl_jax.losses import sft_loss
from orl_jax.models.transformer import ModelConfig
from orl_jax.residual import Residual, residual_from_logits
from orl_jax.train import interrupt, rcd
from orl_jax.train.run import RunLog, finish_run, prepare_run, resume
from orl_jax.setup.build import Setup
from orl_jax.train.state import make_train_step


def self_conditioning_residual(model, pb: SftBatch, key, probability: float) -> Residual:
  """The residual warm-up's input (`train.mode = "residual_warmup"`,
  docs/method.md#the-residual-pathway): for a random
  `probability` share of the rows, a first no-gradient pass of the model itself gives p on the
  noised input and the second pass consumes z = p @ E (scaled like the token embeddings) at the
  masked state tokens; the other rows get no residual (a block's first step: cold start)."""
  cfg = model.cfg
  logits = jax.lax.stop_gradient(model(pb.tokens, pb.positions, pb.meta).logits)
  res = residual_from_logits(logits, jax.lax.stop_gradient(model.embedding_table),
                             embed_scale=cfg.embed_scale, temperature=cfg.residual_temperature,
                             dtype=cfg.compute_dtype)
  use = jax.random.bernoulli(key, probability, (pb.tokens.shape[0], 1))
  at = masked_state_tokens(pb, cfg.mask_id) & use
  return Residual(jnp.where(at[..., None], res.z, 0), jnp.where(at, res.alpha, 0))


def residual_source(setup: Setup):
  """(residual_fn, reference params) of the run's mode: `residual_fn(model, packed, batch, key)`
  gives the residual at the noised tokens, None for plain SFT; the frozen reference's
  parameters travel in every batch (`SftExample.rcd_reference_params`), None but offline RCD."""
  mode = setup.config.train.mode
  if mode == "rcd_offline":
    return rcd.reference_residual_fn(setup)
  if mode == "residual_warmup":
    p_self = setup.config.train.self_condition_probability
    return (lambda model, pb, batch, key: self_conditioning_residual(model, pb, key, p_self)), None
  return None, None


def sft_placement(setup: Setup) -> str:
  """Where the SFT layout places the blocks: as the model's sampler decodes them
  (`Sampler.block_placement`: the block samplers' `from_run.family_rules`)."""
  return decode_build.sampler_of(setup.config, setup.model_cfg).block_placement


def make_sft_step(setup: Setup, run, residual_fn, reference_params):
  """The jitted `(state, batch, base_key) -> (state, metrics)` of the SFT-layout modes."""
  config = setup.config
  # the SFT-layout modes train the shared Transformer (a ModelConfig: it has a mask token)
  loss_fn = lambda model, batch, key: sft_loss(model, batch, key,
                                               block_size=config.decode.block_size,
                                               mask_id=cast(ModelConfig, setup.model_cfg).mask_id,
                                               residual_fn=residual_fn,
                                               vocab_chunk=config.loss.vocab_chunk,
                                               eos_id=setup.tokenizer.eos_id,
                                               placement=sft_placement(setup))
  rows: Any = sharding_lib.batch_sharding(setup.mesh)   # in the arrays' places of SftExample
  repl = sharding_lib.replicated(setup.mesh)
  batch_sh = SftExample(prompt_tokens=rows, prompt_valid=rows, response=rows,
                        rcd_reference_params=jax.tree.map(lambda _: repl, reference_params))
  return make_train_step(run.graphdef, run.optimizer, loss_fn, setup.mesh, run.state_shardings,
                         batch_sh)


def train_sft(setup: Setup, *, progress: bool = True, stop_after: int | None = None) -> str:
  """Runs an SFT-layout mode (sft, residual_warmup, rcd_offline) to `train.steps`."""
  config, tc = setup.config, setup.config.train
  run = prepare_run(setup)
  assert run.ckpt is not None   # `prepare_run` opens it
  assert config.decode.gen_length is not None   # `build_setup` checked that it is set
  data = train_dataset(setup.task.train_problem, setup.tokenizer, prompt_len=config.task.prompt_len,
                       gen_length=config.decode.gen_length, batch_size=tc.batch_size,
                       rows=sharding_lib.process_rows(setup.mesh, tc.batch_size),
                       shuffle_seed=tc.shuffle_seed)
  data_iter = iter(data)
  state, start = resume(run, data_iter)
  residual_fn, reference_params = residual_source(setup)
  step_fn = make_sft_step(setup, run, residual_fn, reference_params)
  base_key = jax.random.key(config.seed)
  log = RunLog(setup, start, config.train.mode, progress=progress, stop_after=stop_after)
  ckpt = run.ckpt
  with interrupt.training_loop(ckpt, start, log.last) as stops:
    t0, step = time.perf_counter(), start
    while step < log.last:
      stops.check(step, state, data_iter, close=log.close)
      batch = sharding_lib.shard_batch(next(data_iter), setup.mesh, tc.batch_size).replace(
          rcd_reference_params=reference_params)
      state, metrics = step_fn(state, batch, base_key)
      step += 1
      if log.due(step):
        steps_per_s = (step - start) / (time.perf_counter() - t0)
        scalars = log.write(step, dict(metrics, steps_per_s=steps_per_s))
        log.bar.set_postfix(loss=f"{scalars['loss']:.3f}", acc=f"{scalars['masked_acc']:.3f}")
      if ckpt.should_save(step, final=step == log.last):
        ckpt.save(step, state, data_iter)
    log.close()
    return finish_run(setup, run, state, step)
