"""A rollout that prefills each prompt once against one that prefills it for every response of
its group, on a tiny-width block-causal model: the lock-step rollout
(`lockstep_trajectories(..., prefill_once=...)`, docs/method.md#the-prompt-is-prefilled-once)
and the per-row one (`per_row_trajectories(..., prefill_once=...)`, one row per response, its
prompt pool: docs/decoding.md#the-prompt-pool).

`--prompts` prompts of `--prompt-len` tokens, `--group` responses each, `--gen` new tokens in
blocks of 4 (SDAR's), every state captured, no early stop (every row decodes all its blocks),
at `fixed_steps` 1 and 4 (1 and 4 tokens committed per denoising step). Both rollouts and both
prefills alone (`lockstep.prefill` on P·G rows and on P rows) are compiled first, then timed
in interleaved rounds in one process (the machine is shared: medians over rounds). The
prediction removes (G−1)/G of the repeated prefill's measured time from the repeated rollout:
speed-up = T_repeated / (T_repeated − (G−1)/G · T_prefill(P·G)). The script also reports what
differs between the two rollouts' outputs (compiled with XLA's default options).

Per-row, the prefill is the engine's first p/b iterations (every row writes a prompt block per
iteration), timed alone as the pool fill (`per_row._fill_pool`) over the P·G repeated prompts;
the prediction is the same formula with it. The pool fill over the P distinct prompts (what the
prefill-once rollout runs) and a one-shot prefill of those prompts (`lockstep.prefill`: faster,
but its keys differ from the block-by-block prefill's in the last bits) are timed beside it.

  python benchmarks/prefill_once.py [--prompts 2] [--group 16] [--prompt-len 512] [--gen 256]
                                    [--rounds 5] [--schedules lockstep,per_row]

JSON: benchmarks/results/prefill_once.json (lock-step), prefill_once_per_row.json (per-row).
"""
import argparse
import dataclasses
import functools
import os
import statistics
import time

import _common
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.decode import lockstep, per_row
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.trajectories import (lockstep_trajectories, make_trajectories,
                                         per_row_trajectories)
from orl_jax.models.transformer import ModelConfig, Transformer
from orl_jax.unmasking import UnmaskRule

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "prefill_once.json")
OUT_PER_ROW = os.path.join(_common.ROOT, "benchmarks", "results", "prefill_once_per_row.json")
# the tests' tiny width (tests/support/helpers.py TINY) with a residual adapter
MODEL = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                    mlp_dim=64, mask_id=1, qk_norm=True, residual_mode="adapter",
                    residual_hidden=32)
BLOCK, EOS = 4, 2


def decode_config(gen: int, tokens_per_step: int) -> DecodeConfig:
  return DecodeConfig(gen_length=gen, block_size=BLOCK, mask_id=MODEL.mask_id, eos_id=EOS,
                      rule=UnmaskRule("fixed_steps", tokens_per_step), temperature=1.0,
                      capture_states=gen // tokens_per_step, eos_early_stop=False,
                      block_placement="prompt_end", commit_compare=">=")


def timed(fn) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def differences(once, repeated) -> dict:
  """{field: (elements that differ, of, max |difference|)} of the fields that differ."""
  out = {}
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(once),
                          jax.tree_util.tree_leaves(repeated), strict=True):
    a, b = np.asarray(a), np.asarray(b)
    if not np.array_equal(a, b):
      d = np.abs(a.astype(np.float64) - b.astype(np.float64))
      out[jax.tree_util.keystr(path)] = [int((d > 0).sum()), int(d.size), float(d.max())]
  return out


def _calls(args, tokens_per_step: int, schedule: str) -> tuple[dict, DecodeConfig]:
  """{name: call} of both rollouts of `schedule` and of the prefills that price them."""
  graphdef, params = nnx.split(Transformer(MODEL, rngs=nnx.Rngs(0)))
  cfg = decode_config(args.gen, tokens_per_step)
  prompts = jax.random.randint(jax.random.key(0), (args.prompts, args.prompt_len), 3,
                               MODEL.vocab_size)
  valid = jnp.ones_like(prompts, bool)
  rollout_of = lockstep_trajectories if schedule == "lockstep" else per_row_trajectories
  rollout = {once: make_trajectories(graphdef, cfg, args.group, rollout_fn=functools.partial(
      rollout_of, prefill_once=once)) for once in (False, True)}
  one_shot = jax.jit(lambda p, t, v: lockstep.prefill(nnx.merge(graphdef, p), t, v, cfg))

  def pool(p, t, v):      # the per-row engine's prefill iterations, one row per prompt
    model = nnx.merge(graphdef, p)
    eng = per_row._queue_engine(model, t, v, jax.random.key(0), cfg, t.shape[0])
    return per_row._fill_pool(eng, 1)[0]

  fill = one_shot if schedule == "lockstep" else jax.jit(pool)
  reps = lambda x: jnp.repeat(x, args.group, axis=0)
  calls = {"repeated": lambda: rollout[False](params, prompts, valid, jax.random.key(1), 0),
           "once": lambda: rollout[True](params, prompts, valid, jax.random.key(1), 0),
           "prefill_pg": lambda: fill(params, reps(prompts), reps(valid)),
           "prefill_p": lambda: fill(params, prompts, valid)}
  if schedule == "per_row":
    calls["one_shot_prefill_p"] = lambda: one_shot(params, prompts, valid)
  return calls, cfg


def measure(args, tokens_per_step: int, schedule: str = "lockstep") -> dict:
  """Medians over interleaved rounds of both rollouts and the prefills, and the prediction."""
  calls, _ = _calls(args, tokens_per_step, schedule)
  outputs = {name: jax.block_until_ready(fn()) for name, fn in calls.items()}   # compile
  times: dict[str, list[float]] = {name: [] for name in calls}
  for _ in range(args.rounds):
    for name, fn in calls.items():
      times[name].append(timed(fn))
  med = {name: statistics.median(t) for name, t in times.items()}
  g = args.group
  predicted = med["repeated"] / (med["repeated"] - (g - 1) / g * med["prefill_pg"])
  measured = med["repeated"] / med["once"]
  return {"schedule": schedule, "tokens_per_step": tokens_per_step, "median_s": med,
          "runs_s": times, "prefill_share": med["prefill_pg"] / med["repeated"],
          "speedup_measured": measured, "speedup_predicted": predicted,
          "fraction_of_predicted": (measured - 1) / (predicted - 1),
          "tpf": args.gen / float(np.mean(outputs["once"].nfe)),   # every row decodes all
          "differences": differences(jax.device_get(outputs["once"]),
                                     jax.device_get(outputs["repeated"]))}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--prompts", type=int, default=2)
  p.add_argument("--group", type=int, default=16)
  p.add_argument("--prompt-len", type=int, default=512)
  p.add_argument("--gen", type=int, default=256)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--schedules", default="lockstep,per_row")
  args = p.parse_args()
  runs = []
  for schedule in args.schedules.split(","):
    runs_of = [measure(args, k, schedule) for k in (1, BLOCK)]
    result = {**vars(args), "model": dataclasses.asdict(MODEL), "block_size": BLOCK,
              "device": jax.devices()[0].device_kind, "jax": jax.__version__, "runs": runs_of}
    _common.write_json(OUT if schedule == "lockstep" else OUT_PER_ROW, result)
    runs += runs_of
  for r in runs:
    m = r["median_s"]
    one_shot = (f" (one-shot prefill of P rows {m['one_shot_prefill_p']:.3f} s)"
                if "one_shot_prefill_p" in m else "")
    print(f"{r['schedule']}, {r['tokens_per_step']} token(s) per step (TPF {r['tpf']:.2f}): "
          f"repeated {m['repeated']:.3f} s, prefill once {m['once']:.3f} s; prefill of P·G rows "
          f"{m['prefill_pg']:.3f} s ({r['prefill_share']:.0%} of the rollout), of P rows "
          f"{m['prefill_p']:.3f} s{one_shot}; speed-up {r['speedup_measured']:.3f}x of a "
          f"predicted {r['speedup_predicted']:.3f}x; outputs that differ: "
          f"{sorted(r['differences']) or 'none'}")
  worst = min(r["fraction_of_predicted"] for r in runs)
  print(f"prefill_once_fraction_of_predicted_speedup: {worst:.2f}")


if __name__ == "__main__":
  main()
