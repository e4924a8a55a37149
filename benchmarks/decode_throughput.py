"""Tokens/s of the jitted block decoder vs a naive decoder that returns to the host every step.

Both use the same model, prompts and greedy rule, and must produce identical tokens (checked).
The naive decoder runs the same jitted pieces (prefill, one denoising step, commit forward) from
a Python loop and reads the block back to the host after every step to decide whether to go on
— the way a straightforward port of a PyTorch sampler works.

  python benchmarks/decode_throughput.py [--batch 64] [--rule threshold_0.9] [--repeats 3]
"""
import argparse
import os

import _common  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np

from configs import tiny
from orl_jax import config as config_lib
from orl_jax import decoding, params_io, residual as residual_lib
from orl_jax.data.pipeline import encode_prompts
from orl_jax.decoding import make_decoder
from orl_jax.models.transformer import init_cache
from orl_jax.train import loop
from orl_jax.unmasking import UnmaskRule, select_commits
from pallas_kernels.staircase_attention import KIND_CLEAN, KIND_STATE
from flax import nnx


def naive_decode(graphdef, params, prompts, valid, dcfg):
  """Host-driven loop: one jitted call per step, a device->host read after each."""
  model_cfg = nnx.merge(graphdef, params).cfg
  b, n, p = dcfg.block_size, dcfg.gen_length, prompts.shape[1]
  rows = prompts.shape[0]

  @jax.jit
  def prefill(params, prompts, valid):
    model = nnx.merge(graphdef, params)
    pos, meta = decoding.prompt_layout(valid, b)
    cache = init_cache(model.cfg, rows, p + n)
    return model(prompts, pos, meta, cache=cache, cache_mode="write", cache_offset=0).cache

  @jax.jit
  def step(params, tokens, res, cache, start, active):
    model = nnx.merge(graphdef, params)
    pos, meta = decoding.block_layout(rows, start, b, KIND_STATE)
    logits = model(tokens, pos, meta, residual=res, cache=cache, cache_mode="read").logits
    cand, conf, ent = decoding.propose(logits, None, 0.0)
    masked = tokens == dcfg.mask_id
    need = active & jnp.any(masked, -1)
    commit = select_commits(dcfg.rule, masked, conf, ent) & need[:, None]
    new = jnp.where(commit, cand, tokens)
    nxt = residual_lib.residual_from_logits(logits, model.embedding_table,
                                            embed_scale=model.cfg.embed_scale,
                                            temperature=model.cfg.residual_temperature,
                                            dtype=model.cfg.compute_dtype)
    still = (new == dcfg.mask_id)[..., None]
    nxt = residual_lib.Residual(jnp.where(still, nxt.z, 0), jnp.where(still[..., 0], nxt.alpha, 0))
    return new, nxt, need

  @jax.jit
  def commit_forward(params, tokens, cache, start):
    model = nnx.merge(graphdef, params)
    pos, meta = decoding.block_layout(rows, start, b, KIND_CLEAN)
    return model(tokens, pos, meta, cache=cache, cache_mode="write", cache_offset=start).cache

  cache = prefill(params, prompts, valid)
  finished = np.zeros((rows,), bool)
  nfe = np.zeros((rows,), np.int32)
  out = np.full((rows, n), dcfg.eos_id, np.int32)
  for j in range(dcfg.n_blocks):
    if finished.all():
      break
    start = p + j * b
    active = ~finished
    tokens = jnp.asarray(np.where(active[:, None], dcfg.mask_id, dcfg.eos_id).repeat(b, 1))
    res = residual_lib.zero_residual(rows, b, model_cfg.d_model, model_cfg.compute_dtype)
    for _ in range(dcfg.steps_bound):
      tokens, res, need = step(params, tokens, res, cache, start, jnp.asarray(active))
      need = np.asarray(need)              # host sync every step
      nfe += need
      if not (active & (np.asarray(tokens) == dcfg.mask_id).any(-1)).any():
        break
    host = np.asarray(tokens)
    host = np.where(host == dcfg.mask_id, dcfg.eos_id, host)
    out[:, j * b:(j + 1) * b] = np.where(active[:, None], host, out[:, j * b:(j + 1) * b])
    eos_here = active & (host == dcfg.eos_id).any(-1)
    needs_commit = active & ~eos_here & (j < dcfg.n_blocks - 1)
    if needs_commit.any():
      cache = commit_forward(params, jnp.asarray(host), cache, start)
      nfe += needs_commit
    finished |= eos_here
  first = np.where((out == dcfg.eos_id).any(-1), (out == dcfg.eos_id).argmax(-1), n - 1)
  out = np.where(np.arange(n)[None] > first[:, None], dcfg.eos_id, out)
  return out, nfe, first + 1


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--rule", default="threshold_0.9")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--params", default="assets/tiny_base",
                  help="parameter folder (a random tiny model is used if it does not exist)")
  ap.add_argument("--out", default="benchmarks/results/decode_throughput.json")
  args = ap.parse_args()

  config = tiny.get_config("eval")
  s = loop.setup(config)
  graphdef, params = loop.initial_params(s)
  used = "random init"
  if os.path.exists(os.path.join(args.params, params_io.META_FILE)):
    params, _ = params_io.load_params(args.params, params)
    used = args.params
  tok = s.tokenizer
  problems = s.task.eval_problems()[:args.batch]
  prompts, valid = encode_prompts(problems, tok, config.task.prompt_len)
  dcfg = config_lib.decode_config(config, mask_id=tok.mask_id, eos_id=tok.eos_id,
                                  rule=UnmaskRule.parse(args.rule), temperature=0.0)
  jitted = make_decoder(graphdef, dcfg)
  key = jax.random.key(0)

  def run_jitted():
    return jax.block_until_ready(jitted(params, prompts, valid, key))

  ref = run_jitted()  # compile + warm-up
  naive_out = naive_decode(graphdef, params, prompts, valid, dcfg)  # compile + warm-up
  same = (np.array_equal(np.asarray(ref.tokens), naive_out[0])
          and np.array_equal(np.asarray(ref.nfe_engine), naive_out[1]))
  if not same:
    raise SystemExit("jitted and naive decoders disagree; the comparison would be meaningless")
  n_tokens = int(np.asarray(ref.n_generated).sum())
  t_jit, all_jit = _common.median_time(run_jitted, args.repeats)
  t_naive, all_naive = _common.median_time(
      lambda: naive_decode(graphdef, params, prompts, valid, dcfg), args.repeats)
  result = {
      "batch": args.batch, "rule": args.rule, "params": used, "device": jax.devices()[0].device_kind,
      "generated_tokens": n_tokens, "nfe_mean": float(np.asarray(ref.nfe).mean()),
      "jitted_seconds_median": t_jit, "naive_seconds_median": t_naive,
      "jitted_tokens_per_s": n_tokens / t_jit, "naive_tokens_per_s": n_tokens / t_naive,
      "speedup": t_naive / t_jit, "jitted_runs": all_jit, "naive_runs": all_naive,
      "outputs_identical": same,
  }
  _common.write_json(args.out, result)
  print(f"batch {args.batch}, {args.rule}, params: {used}, {n_tokens} tokens, "
        f"NFE {result['nfe_mean']:.1f}")
  print(f"jitted: {result['jitted_tokens_per_s']:.0f} tok/s   naive: "
        f"{result['naive_tokens_per_s']:.0f} tok/s")
  print(f"decode_speedup_jitted_vs_naive: {result['speedup']:.2f}")


if __name__ == "__main__":
  main()
