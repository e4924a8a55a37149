"""What compiling the lock-step rollout without XLA:CPU's YNNPACK fusions costs, the compile
under which prefilling each prompt once is bit-identical to prefilling it for every response
(docs/decoding.md#orlprefill_once-stays-off-by-default).

The rollout of benchmarks/prefill_once.py (its model, shapes and decode settings: `--prompts`
prompts of `--prompt-len` tokens, `--group` responses each, `--gen` new tokens in blocks of 4,
every state captured, no early stop), at 1 and 4 tokens per step, four ways: repeated prompt /
prefilled once, each with XLA's default options and without the YNNPACK fusions
(`decode.compile_options.step_compiler_options`'s options). All eight are compiled first, then
timed in interleaved rounds in one process (medians). Reported: each variant's time, the
speed-up of prefill-once without the fusions over today's default (repeated, fusions on), and
which outputs differ between the two prefill modes under each compile.

  python benchmarks/prefill_once_options.py [--prompts 2] [--group 16] [--prompt-len 512]
                                            [--gen 256] [--rounds 3]
"""
import argparse
import functools
import os
import statistics

import _common
import jax
import jax.numpy as jnp
from flax import nnx

import prefill_once as bench
from orl_jax.decode.compile_options import step_compiler_options
from orl_jax.decode.trajectories import lockstep_trajectories, make_trajectories
from orl_jax.models.transformer import Transformer

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "prefill_once_options.json")


def no_fusion_options() -> dict:
  """XLA:CPU's options without YNNPACK fusions (those of a decoder of few-token steps)."""
  options = step_compiler_options(1)
  if not options:
    raise SystemExit("this jaxlib's XLA:CPU takes no YNNPACK option (or the platform is not "
                     "CPU): nothing to compare")
  return options


def measure(args, tokens_per_step: int) -> dict:
  """Medians over interleaved rounds of the four compiled rollouts, and their differences."""
  graphdef, params = nnx.split(Transformer(bench.MODEL, rngs=nnx.Rngs(0)))
  cfg = bench.decode_config(args.gen, tokens_per_step)
  prompts = jax.random.randint(jax.random.key(0), (args.prompts, args.prompt_len), 3,
                               bench.MODEL.vocab_size)
  valid = jnp.ones_like(prompts, bool)
  call = (params, prompts, valid, jax.random.key(1), 0)
  options = {"default": None, "no_fusions": no_fusion_options()}
  compiled = {}
  for once in (False, True):
    jitted = make_trajectories(graphdef, cfg, args.group, rollout_fn=functools.partial(
        lockstep_trajectories, prefill_once=once))
    for opt_name, opts in options.items():
      lowered = jitted.lower(*call)
      compiled[f"{'once' if once else 'repeated'}/{opt_name}"] = (
          lowered.compile(compiler_options=opts) if opts else lowered.compile())
  outputs = {name: jax.device_get(fn(*call)) for name, fn in compiled.items()}   # warm-up
  times: dict[str, list[float]] = {name: [] for name in compiled}
  for _ in range(args.rounds):
    for name, fn in compiled.items():
      times[name].append(bench.timed(functools.partial(fn, *call)))
  med = {name: statistics.median(t) for name, t in times.items()}
  return {"tokens_per_step": tokens_per_step, "median_s": med, "runs_s": times,
          "once_no_fusions_vs_repeated_default": med["repeated/default"] / med["once/no_fusions"],
          "once_default_vs_repeated_default": med["repeated/default"] / med["once/default"],
          "no_fusions_cost_repeated": med["repeated/no_fusions"] / med["repeated/default"],
          "differences": {opt: bench.differences(outputs[f"once/{opt}"],
                                                 outputs[f"repeated/{opt}"])
                          for opt in options},
          "once_no_fusions_vs_repeated_default_differences": bench.differences(
              outputs["once/no_fusions"], outputs["repeated/default"])}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--prompts", type=int, default=2)
  p.add_argument("--group", type=int, default=16)
  p.add_argument("--prompt-len", type=int, default=512)
  p.add_argument("--gen", type=int, default=256)
  p.add_argument("--rounds", type=int, default=3)
  args = p.parse_args()
  runs = [measure(args, k) for k in (1, bench.BLOCK)]
  result = {**vars(args), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "no_fusion_options": no_fusion_options(), "runs": runs}
  _common.write_json(OUT, result)
  for r in runs:
    m = r["median_s"]
    print(f"{r['tokens_per_step']} token(s) per step: " + ", ".join(
        f"{name} {s:.3f} s" for name, s in m.items()))
    print(f"  prefill once without fusions vs repeated with them (today's default): "
          f"{r['once_no_fusions_vs_repeated_default']:.3f}x; with fusions "
          f"{r['once_default_vs_repeated_default']:.3f}x; the repeated rollout without fusions "
          f"takes {r['no_fusions_cost_repeated']:.3f}x its default time; outputs that differ "
          f"between the prefill modes: default {sorted(r['differences']['default']) or 'none'}, "
          f"no fusions {sorted(r['differences']['no_fusions']) or 'none'}")
  worst = min(r["once_no_fusions_vs_repeated_default"] for r in runs)
  print(f"prefill_once_no_fusions_speedup_worst: {worst:.3f}")


if __name__ == "__main__":
  main()
