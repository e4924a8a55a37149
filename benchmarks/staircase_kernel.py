"""How much of a packed replay row the staircase kernels skip, and (on an accelerator) how fast.

Two rows (docs/method.md#replay-states-packing-staircase-attention layout, tile 128):
* ``tiny_demo`` — the tiny default's replay: a 32-token prompt, block 32, G=8 one-block responses,
  every state of a 6-step trajectory (1,824 tokens, padded to 1,920);
* ``synthetic_8k`` — a shared 512-token prompt, G=16 responses of 4 blocks of 32, 11 states per
  response (3, 3, 3, 2 per block), exactly 8,192 tokens.

For each it prints the fraction of (128 x 128) tiles skipped, and the share of the dense work
(query-key pairs) the kernels compute at square tiles of 64 to 512 (what a larger tile costs
in skipped work; the tiles each chip accepts: `kernel_compile.py`). On a GPU/TPU it also times the
Pallas kernel (and splash on TPU) against the dense XLA reference, forward and forward+backward,
median of several runs, with TFLOP/s of the *visible* work; on CPU timing is skipped (interpret
mode measures nothing useful). Writes JSON; the last printed line is ``tiles_skipped_8k: X``.

  python benchmarks/staircase_kernel.py [--out benchmarks/results/staircase_kernel.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import _common  # noqa: F401  (puts the repository on sys.path)
from pallas_kernels.staircase_attention import (TokenMeta, attention, build_tile_map,
                                                staircase_visible)
from pallas_kernels.staircase_attention.testing import prompt_group, stack_rows
from pallas_kernels.staircase_attention.tile_map import pad_meta

TILE = 128
TILES = (64, 128, 256, 512)  # square tiles whose computed share of the row is reported
HEADS_Q, HEADS_KV, HEAD_DIM = 16, 4, 128  # a Qwen3-like GQA attention layer (timing only)


def _row(prompt_len, block, responses, states_per_block) -> TokenMeta:
  rows, _ = prompt_group(0, prompt_len, block, [len(states_per_block)] * responses,
                         [states_per_block] * responses, 0)
  return stack_rows([rows], -(-len(rows) // TILE) * TILE)


def benchmark_rows() -> dict[str, TokenMeta]:
  return {"tiny_demo": _row(32, 32, 8, [6]),
          "synthetic_8k": _row(512, 32, 16, [3, 3, 3, 2])}


def computed_fraction(meta: TokenMeta, tile: int) -> float:
  """The share of the row's dense query-key pairs the kernels compute at square `tile`s."""
  row_len = meta.kind.shape[-1]
  padded = pad_meta(TokenMeta(*(jnp.asarray(f) for f in meta)), -(-row_len // tile) * tile)
  nonempty = int(build_tile_map(padded, padded, tile, tile).any_visible.sum())
  return nonempty * tile * tile / row_len ** 2


def tile_stats(meta: TokenMeta) -> dict:
  """Skipped / full tile counts at TILE, the fraction of visible query-key pairs, and the
  fraction computed at other tile sizes."""
  tiles = build_tile_map(meta, meta, TILE, TILE)
  total = int(np.prod(tiles.any_visible.shape))
  nonempty = int(tiles.any_visible.sum())
  visible_pairs = int(np.asarray(staircase_visible(meta, meta, xp=np)).sum())
  tokens = int((np.asarray(meta.kind) != 0).sum())
  return dict(tokens=tokens, row_len=int(meta.kind.shape[-1]), tiles_total=total,
              tiles_nonempty=nonempty, tiles_full=int(tiles.all_visible.sum()),
              fraction_skipped=1 - nonempty / total,
              visible_pair_fraction=visible_pairs / meta.kind.shape[-1] ** 2,
              visible_pairs=visible_pairs,
              computed_pair_fraction_by_tile={t: computed_fraction(meta, t) for t in TILES})


def _median_seconds(fn, *args, runs: int = 7) -> float:
  jax.block_until_ready(fn(*args))  # compile and warm up
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_impls(meta: TokenMeta, visible_pairs: int, *, heads_q: int = HEADS_Q,
               heads_kv: int = HEADS_KV, head_dim: int = HEAD_DIM, runs: int = 7) -> dict:
  """Median seconds, ratio to xla and TFLOP/s of visible work for each available impl."""
  t = meta.kind.shape[-1]
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (1, t, heads_q, head_dim), jnp.bfloat16)
  k = jax.random.normal(keys[1], (1, t, heads_kv, head_dim), jnp.bfloat16)
  v = jax.random.normal(keys[2], (1, t, heads_kv, head_dim), jnp.bfloat16)
  impls = ["xla", "pallas"] + (["splash"] if jax.default_backend() == "tpu" else [])
  fwd_flops = 4 * visible_pairs * heads_q * head_dim  # QK^T and PV on visible pairs
  results = {}
  for impl in impls:
    fwd = jax.jit(lambda q, k, v, impl=impl: attention(q, k, v, meta, meta, impl=impl))
    loss = lambda q, k, v, impl=impl: jnp.sum(
        attention(q, k, v, meta, meta, impl=impl).astype(jnp.float32))
    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    results[impl] = dict(fwd_s=_median_seconds(fwd, q, k, v, runs=runs),
                         fwd_bwd_s=_median_seconds(fwd_bwd, q, k, v, runs=runs))
  for r in results.values():
    r["fwd_speedup_vs_xla"] = results["xla"]["fwd_s"] / r["fwd_s"]
    r["fwd_bwd_speedup_vs_xla"] = results["xla"]["fwd_bwd_s"] / r["fwd_bwd_s"]
    r["fwd_tflops_visible"] = fwd_flops / r["fwd_s"] / 1e12
    r["fwd_bwd_tflops_visible"] = 3.5 * fwd_flops / r["fwd_bwd_s"] / 1e12  # bwd ~ 2.5x fwd
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/results/staircase_kernel.json")
  args = parser.parse_args()
  platform = jax.default_backend()
  report = dict(platform=platform, device=str(jax.devices()[0]), jax=jax.__version__, tile=TILE,
                heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=HEAD_DIM, rows={})
  for name, meta in benchmark_rows().items():
    stats = tile_stats(meta)
    print(f"{name}: {stats['tokens']} tokens in a {stats['row_len']}-token row; "
          f"{stats['tiles_nonempty']}/{stats['tiles_total']} tiles non-empty "
          f"({stats['tiles_full']} full); visible pairs {stats['visible_pair_fraction']:.3f}; "
          "pairs computed at tiles " + ", ".join(
              f"{t}: {f:.3f}" for t, f in stats["computed_pair_fraction_by_tile"].items()))
    if platform in ("gpu", "tpu"):
      stats["timing"] = time_impls(TokenMeta(*(jnp.asarray(f) for f in meta)),
                                   stats["visible_pairs"])
      for impl, r in stats["timing"].items():
        print(f"  {impl:>6}: fwd {r['fwd_s'] * 1e3:.3f} ms ({r['fwd_speedup_vs_xla']:.2f}x xla, "
              f"{r['fwd_tflops_visible']:.1f} TFLOP/s visible), fwd+bwd "
              f"{r['fwd_bwd_s'] * 1e3:.3f} ms ({r['fwd_bwd_speedup_vs_xla']:.2f}x xla)")
    report["rows"][name] = stats
  if platform not in ("gpu", "tpu"):
    print(f"timing skipped on {platform} (kernels run only in interpret mode there)")
    report["timing"] = f"skipped on {platform}"
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(report, f, indent=2)
  print(f"wrote {args.out}")
  print(f"tiles_skipped_tiny_demo: {report['rows']['tiny_demo']['fraction_skipped']:.4f}")
  print(f"tiles_skipped_8k: {report['rows']['synthetic_8k']['fraction_skipped']:.4f}")


if __name__ == "__main__":
  main()
