"""The blocking part of a rollout snapshot's save against its whole write
(`checkpoint.save_in_background`, docs/training.md#starting-a-run-from-python).

A trajectory-shaped tree (one large float32 array standing for the captured residuals, which
are 90-98% of a real snapshot, plus the small int and bool arrays) is saved `--repeats` times
into a temporary Orbax directory: the blocking time is until `save` returns (the copy to host
memory, the folder set-up), the whole write until the wait right after it returns. The loop
keeps only the blocking part on its critical path while planning, gather and the update run.

  python benchmarks/snapshot_write.py [--mib 256] [--repeats 5]
"""
import argparse
import os
import statistics
import tempfile
import time

import _common
import jax
import jax.numpy as jnp

from orl_jax.storage.checkpoint import Checkpointer, save_in_background

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "snapshot_write.json")


def trajectory_like(mib: int, step: int) -> dict:
  """{residuals: [S, 1024] float32 of `mib` MiB, tokens: [64, 256] int32, valid: [64, 256] bool,
  rewards: [64] float32}, different for every `step` (no write is a copy of the last)."""
  key = jax.random.key(step)
  rows = mib * 2**20 // (4 * 1024)
  return {"residuals": jax.random.normal(key, (rows, 1024), jnp.float32),
          "tokens": jax.random.randint(key, (64, 256), 0, 32000, jnp.int32),
          "valid": jax.random.bernoulli(key, 0.9, (64, 256)),
          "rewards": jax.random.uniform(key, (64,), jnp.float32)}


def measure(directory: str, mib: int, repeats: int) -> list[dict]:
  ckpt = Checkpointer(directory, every=1, keep=1)
  out = []
  for step in range(repeats + 1):      # step 0 warms Orbax up and is dropped
    tree = jax.block_until_ready(trajectory_like(mib, step))
    t0 = time.perf_counter()
    seconds = save_in_background(ckpt, step, tree)
    del tree                             # as the loop does once the batch is gathered
    ckpt.wait()
    total = time.perf_counter() - t0
    if step:
      out.append({"blocking_s": seconds["sec_blocking"], "total_s": total})
  ckpt.close()
  return out


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--mib", type=int, default=256)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    runs = measure(os.path.join(tmp, "rollouts"), args.mib, args.repeats)
  blocking = statistics.median(r["blocking_s"] for r in runs)
  total = statistics.median(r["total_s"] for r in runs)
  result = {"mib": args.mib, "repeats": args.repeats, "device": jax.devices()[0].device_kind,
            "median_blocking_s": blocking, "median_total_s": total,
            "blocking_fraction": blocking / total, "runs": runs}
  _common.write_json(OUT, result)
  print(f"{args.mib} MiB snapshot on {result['device']}: save blocks {blocking:.3f} s of a "
        f"{total:.3f} s write (medians of {args.repeats})")
  print(f"snapshot_blocking_fraction: {blocking / total:.3f}")


if __name__ == "__main__":
  main()
