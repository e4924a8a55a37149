"""The first run on a GPU or TPU host (about 8 minutes): is the accelerator path right, and fast?

Four sections, printed and written to JSON:
* ``parity``      — every kernel of the platform (`dispatch.KERNELS`) against the dense XLA
  reference, output and gradients, at 3 shapes (relative to the largest reference value);
* ``kernel_time`` — kernel forward and forward+backward time on a packed row vs the dense XLA
  time, and vs dense x the non-empty tile fraction (what perfect tile skipping would reach);
* ``decode``      — jitted decoder tokens/s at batch 1 and 64 on a ~1B-parameter random
  block-causal model, beside the memory-bandwidth bound
  `batch x TPF x HBM bandwidth / weight bytes` (each forward reads every weight once);
* ``orl_step``    — one ORL train step on packed vs naive replay at G = 16
  (`replay_speedup.measure`; `--small`: one step each at G = 2, a 64-token prompt, 2 blocks
  of 2 steps).

Beside each decode measurement it prints what the compiler predicts for the same program
(`orl_jax.aot`, the predictions `launch/compile.py` makes without a device): one denoising
forward compiled on this device, its roofline time (FLOPs over the chip's peak, bytes over its
bandwidth: the TPU compiler's cost analysis; on a GPU the estimates of `orl_jax.aot.report`),
and the tokens/s it implies at the measured TPF — so the first accelerator run says how good
the compile command's predictions are (`predicted_over_measured`).

  python benchmarks/device_check.py                          # on the GPU / TPU host
  python benchmarks/device_check.py --platform=cpu --small   # smoke run, CPU, < 3 minutes

`--platform` is the backend the run must be on (it stops if JAX picked another). On CPU the
kernels run in interpret mode: the figures only show that the script runs. The last line printed
is `kernel_parity_max_rel_err: X`.
"""
import argparse
import dataclasses
import functools
import types

import _common
import jax
import jax.numpy as jnp
import numpy as np

import replay_speedup
import staircase_kernel
from configs import tiny
from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax import sharding as sharding_lib
from orl_jax.data.tiny_task import tiny_tokenizer
from orl_jax.decode import block_sampler
from orl_jax.decode import build as decode_build
from orl_jax.aot import programs as aot_programs
from orl_jax.aot import report as aot_report
from orl_jax.aot import targets as aot_targets
from orl_jax.config.sections import Loss
from orl_jax.losses import LossConfig, OrlObjective
from orl_jax.models.build import init_model_params
from orl_jax.optimizer import optimizer_of
from orl_jax.unmasking import UnmaskRule
from pallas_kernels.staircase_attention import (KERNELS, TokenMeta, attention, current_platform,
                                                staircase_attention_reference, testing)

# (batch, seq_len, Hq, Hkv, head_dim, dtype, block size)
PARITY_SHAPES = {
    "full": [(1, 2048, 8, 2, 128, "bfloat16", 32), (1, 4096, 8, 8, 64, "float32", 32),
             (2, 8192, 16, 4, 128, "bfloat16", 32)],
    "small": [(1, 128, 2, 1, 64, "float32", 8), (1, 128, 2, 2, 128, "bfloat16", 32),
              (2, 128, 4, 2, 64, "float32", 4)],
}
# model width for the decode section: ~1B parameters (bf16) / a tiny one for --small
DECODE_MODEL = {
    "full": dict(d_model=2048, n_layers=16, n_heads=16, n_kv_heads=16, head_dim=128,
                 mlp_dim=5632, vocab_size=32000, dtype="bfloat16", param_dtype="bfloat16"),
    "small": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128),
}


def _rel_err(got, want) -> float:
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want))))


def parity(size: str) -> dict:
  platform = current_platform()
  impls = [impl for impl, p in KERNELS if p == platform]
  out = {}
  for i, (b, t, hq, hkv, dh, dtype, block) in enumerate(PARITY_SHAPES[size]):
    meta = TokenMeta(*(jnp.asarray(f) for f in testing.random_packed_meta(
        np.random.default_rng(i), b, t, block, fill=0.9)))
    keys = jax.random.split(jax.random.key(i), 4)
    q = jax.random.normal(keys[0], (b, t, hq, dh)).astype(dtype)
    k, v = (jax.random.normal(key, (b, t, hkv, dh)).astype(dtype) for key in keys[1:3])
    d_out = jax.random.normal(keys[3], q.shape).astype(dtype)

    def value_and_grads(fn, args=(q, k, v, d_out, meta)):
      def run(q_in, k_in, v_in, d_out_in, meta_in):
        out, vjp = jax.vjp(lambda *qkv: fn(*qkv, meta_in, meta_in), q_in, k_in, v_in)
        return (out, *vjp(d_out_in))
      return jax.jit(run)(*args)

    want = value_and_grads(staircase_attention_reference)
    name = f"b{b}_t{t}_h{hq}x{hkv}_d{dh}_{dtype}"
    for impl in impls:
      got = value_and_grads(lambda *a, impl=impl: attention(*a, impl=impl))
      out[f"{impl}/{name}"] = max(_rel_err(g, w) for g, w in zip(got, want))
      print(f"parity {impl:>6} {name}: max rel err {out[f'{impl}/{name}']:.2e}", flush=True)
  return out


def kernel_time(size: str) -> dict:
  if size == "full":
    meta, dims, runs = staircase_kernel.benchmark_rows()["synthetic_8k"], {}, 7
  else:
    rows, _ = testing.prompt_group(0, 32, 8, [2, 2], [[2, 1], [1, 2]], 0)
    meta, runs = testing.stack_rows([rows], 256), 1
    dims = dict(heads_q=2, heads_kv=1, head_dim=64)
  stats = staircase_kernel.tile_stats(meta)
  timing = staircase_kernel.time_impls(TokenMeta(*(jnp.asarray(f) for f in meta)),
                                       stats["visible_pairs"], runs=runs, **dims)
  nonempty = stats["tiles_nonempty"] / stats["tiles_total"]
  for impl, r in timing.items():
    for pass_ in ("fwd", "fwd_bwd"):
      r[f"{pass_}_vs_dense_x_tiles"] = r[f"{pass_}_s"] / (timing["xla"][f"{pass_}_s"] * nonempty)
    print(f"kernel {impl:>6}: fwd {r['fwd_s'] * 1e3:.2f} ms ({r['fwd_speedup_vs_xla']:.2f}x "
          f"dense), fwd+bwd {r['fwd_bwd_s'] * 1e3:.2f} ms ({r['fwd_bwd_speedup_vs_xla']:.2f}x "
          f"dense; {r['fwd_bwd_vs_dense_x_tiles']:.2f} of dense x {nonempty:.3f} non-empty tiles)",
          flush=True)
  return dict(row_tokens=stats["row_len"], nonempty_tile_fraction=nonempty, timing=timing)


def device_budget(override_gbps: float | None):
  """This device's share of its chip (`orl_jax.aot.targets.CHIPS`; the bandwidth overridden
  by --hbm-gbps), or None for a device the table does not know (CPU)."""
  chip = aot_targets.chip_of_device(jax.devices()[0])
  if chip is None:
    return None if not override_gbps else aot_targets.DeviceBudget(0, 0.0, override_gbps * 1e9)
  if override_gbps:
    chip = dataclasses.replace(chip, hbm_bandwidth=override_gbps * 1e9)
  return aot_targets.chip_budget(chip, jax.devices(), jax.default_backend())


def predicted_forward(graphdef, params, decode_cfg, batch: int, p_len: int, budget) -> dict:
  """One denoising forward of `decode_cfg` at `batch` rows compiled on this device: its
  FLOPs, bytes and roofline seconds (what `launch/compile.py` prices a forward with)."""
  step, args, _, _ = aot_programs.forward_programs(graphdef, params, decode_cfg, batch, p_len)
  lowered = step.lower(*args)
  flops, moved, compiler_s, source = aot_report.program_cost(lowered, lowered.compile(), 1)
  seconds = max(flops / budget.peak_flops if budget.peak_flops else 0.0,
                moved / budget.hbm_bandwidth)
  return dict(flops=flops, bytes=moved, cost_source=source, roofline_s=seconds,
              compiler_estimate_s=compiler_s)


def decode(size: str, budget) -> dict:
  config = tiny.get_config("eval")
  tok = tiny_tokenizer()
  model_cfg = config_lib.model_config(run_config.convert(config), vocab_size=tok.vocab_size,
                                  mask_id=tok.mask_id)
  model_cfg = type(model_cfg)(**{**model_cfg.__dict__, **DECODE_MODEL[size]})
  graphdef, params = init_model_params(model_cfg, 0)
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  rule = UnmaskRule.parse("threshold_0.9")
  run = decode_build.make_decoder(config, model_cfg, graphdef, "evaluate", mask_id=tok.mask_id,
                              eos_id=tok.eos_id, rule=rule, temperature=0.0)
  decode_cfg = block_sampler.block_decode_config(config, model_cfg, "evaluate",
                                                 mask_id=tok.mask_id, eos_id=tok.eos_id,
                                                 rule=rule, temperature=0.0)
  bandwidth = budget.hbm_bandwidth if budget else None
  out = dict(params=sum(x.size for x in jax.tree.leaves(params)), weight_bytes=weight_bytes,
             hbm_bytes_per_s=bandwidth)
  for batch in (1, 64):
    prompts = jax.random.randint(jax.random.key(batch), (batch, config.task.prompt_len), 4,
                                 tok.vocab_size)
    valid = jnp.ones(prompts.shape, bool)
    call = functools.partial(lambda *a: jax.block_until_ready(run(*a)), params, prompts, valid,
                             jax.random.key(0))
    result = call()  # compile + warm-up
    seconds, _ = _common.median_time(call, 2 if size == "full" else 1)
    n_gen = np.asarray(result.n_generated)
    tpf = float(np.mean(n_gen / np.maximum(np.asarray(result.nfe), 1)))
    bound = batch * tpf * bandwidth / weight_bytes if bandwidth else None
    measured = float(n_gen.sum()) / seconds
    row = dict(tokens_per_s=measured, tpf=tpf, bandwidth_bound_tokens_per_s=bound)
    line = (f"decode batch {batch}: {measured:.0f} tok/s (TPF {tpf:.2f}; bandwidth bound "
            f"{'n/a' if bound is None else f'{bound:.0f}'} tok/s)")
    if budget is not None:
      pred = predicted_forward(graphdef, params, decode_cfg, batch, config.task.prompt_len,
                               budget)
      pred["tokens_per_s"] = batch * tpf / pred["roofline_s"]
      pred["predicted_over_measured"] = pred["tokens_per_s"] / measured
      row["predicted"] = pred
      line += (f"; compiler's roofline {pred['tokens_per_s']:.0f} tok/s "
               f"({pred['predicted_over_measured']:.2f}x measured, {pred['cost_source']})")
    out[f"batch_{batch}"] = row
    print(line, flush=True)
  return out


def orl_step(size: str) -> dict:
  config = tiny.get_config("sft")
  tok = tiny_tokenizer()
  typed = run_config.convert(config)
  s_cfg = config_lib.model_config(typed, vocab_size=tok.vocab_size, mask_id=tok.mask_id)
  optimizer = optimizer_of(dataclasses.replace(config_lib.optimizer_config(typed),
                                               residual_lr_scale=1.0), s_cfg)
  mesh = sharding_lib.make_mesh()
  # the KL anchor to the rollout policy: the benchmark's states carry no frozen reference copy
  objective = OrlObjective(LossConfig.from_section(
      Loss(gate_entropy=0.0, conf_entropy=0.9, kl_reference="rollout")))
  if size == "full":
    args = types.SimpleNamespace(responses_per_row=[1, 2], memory_gb=40.0, check_factor=1,
                                 repeats=3)
    out = replay_speedup.measure(16, args, s_cfg, optimizer, mesh, objective)
    return dict(group=16, packed_step_s=(out["packed"] or {}).get("seconds_median"),
                naive_step_s=out["naive"].get("seconds_median"), speedup=out["speedup"])
  # smoke run: G = 2 on a smaller workload, one step per layout, no memory search
  rs, group = replay_speedup, 2
  rs.set_workload(prompt=64, n_blocks=2, steps=2)
  traj = rs.synthetic_trajectories(group, s_cfg, np.random.default_rng(group))
  seconds = {}
  for layout, row_len in (("packed", rs.PROMPT + rs.CLEAN_AND_STATES),
                          ("naive", rs.PROMPT + rs.N_BLOCKS * rs.BLOCK)):
    _, stats = rs._plan(traj, group, layout, row_len, group * rs.STATES, 1)
    runner = rs.Runner(traj, group, layout, row_len, stats["rows_used"], 1, s_cfg, optimizer,
                       mesh, objective)
    runner.run_once()
    seconds[layout] = runner.result()["seconds_median"]
  print(f"orl step G={group}: packed {seconds['packed']:.3f} s, naive {seconds['naive']:.3f} s",
        flush=True)
  return dict(group=group, packed_step_s=seconds["packed"], naive_step_s=seconds["naive"],
              speedup=seconds["naive"] / seconds["packed"])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--platform", default="auto", choices=["auto", "cpu", "gpu", "tpu"],
                  help="the backend this run must be on")
  ap.add_argument("--small", action="store_true", help="small shapes (a CPU smoke run)")
  ap.add_argument("--hbm-gbps", type=float, default=None,
                  help="HBM bandwidth for the decode bound (default: by device kind)")
  ap.add_argument("--out", default="benchmarks/results/device_check.json")
  args = ap.parse_args()
  backend = jax.default_backend()
  if args.platform != "auto" and backend != args.platform:
    raise SystemExit(f"--platform={args.platform} but JAX runs on {backend}: check the jax "
                     "install (pip install -e '.[cuda]' or '.[tpu]') and JAX_PLATFORMS.")
  size = "small" if args.small else "full"
  report = dict(backend=backend, device=jax.devices()[0].device_kind, jax=jax.__version__,
                size=size)
  print(f"device check on {report['device']} ({backend}, jax {jax.__version__}), {size} shapes",
        flush=True)
  report["parity"] = parity(size)
  _common.write_json(args.out, report)  # keep what finished if a later section dies
  report["kernel_time"] = kernel_time(size)
  _common.write_json(args.out, report)
  report["decode"] = decode(size, device_budget(args.hbm_gbps))
  _common.write_json(args.out, report)
  report["orl_step"] = orl_step(size)
  _common.write_json(args.out, report)
  print(f"wrote {args.out}")
  print(f"kernel_parity_max_rel_err: {max(report['parity'].values()):.2e}")


if __name__ == "__main__":
  main()
