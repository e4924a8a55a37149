"""The decoder against this machine's bounds
(docs/benchmarks.md#the-decoder-against-the-machines-bounds).

Two peaks are measured in the benchmark's own process, timed in the same rounds as the decoders
they bound (medians; the machine may be shared): the f32 matmul rate (a 2048^3 product) and the
memory bandwidth (a 128 MiB array read once and written once, in place).
A decode's work is counted from the model config and the decode's forward counts
(`decode_work`): the matmul FLOPs of the forwards it runs (the body at the tokens each forward
carries, attention against every key slot the compiled forward reads, the head and the
residual's soft embedding at the masked positions only) and the least bytes it must move (the
weights once per batch forward, the stored keys and values once per row forward). The count of
one denoising step is checked against XLA's cost analysis of the compiled step
(`xla_step_check`). Fractions: FLOPs / seconds / peak rate, bytes / seconds / peak bandwidth.
"""
from __future__ import annotations

import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

MATMUL_N, COPY_MIB = 2048, 128


def peak_runs() -> dict:
  """{"peak/matmul", "peak/copy"}: callables (compiled, warmed up) of the two peak probes, to be
  timed among the decoders they bound (the same rounds, so the same load)."""
  a = jnp.ones((MATMUL_N, MATMUL_N), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  # each byte read once and written once, in place (donated: no fresh pages to fault in)
  copy = jax.jit(lambda x: x + 1.0, donate_argnums=0)
  held = [jnp.ones((COPY_MIB << 18,), jnp.float32)]              # COPY_MIB MiB of f32

  def run_copy():
    held[0] = jax.block_until_ready(copy(held[0]))

  runs = {"peak/matmul": lambda: jax.block_until_ready(mm(a)), "peak/copy": run_copy}
  for run in runs.values():
    run()
  return runs


def peaks(seconds: dict) -> dict:
  """{matmul_gflop_s, bandwidth_gb_s} from the probes' median seconds ({name: seconds})."""
  return dict(matmul_gflop_s=2 * MATMUL_N ** 3 / seconds["peak/matmul"] / 1e9,
              bandwidth_gb_s=2 * (COPY_MIB << 20) / seconds["peak/copy"] / 1e9,
              matmul_n=MATMUL_N, copy_mib=COPY_MIB)


def measure_peaks(repeats: int = 5) -> dict:
  """`peaks` of `repeats` runs of each probe: what this machine sustains now (it may be shared)."""
  def median(run):
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      run()
      times.append(time.perf_counter() - t0)
    return statistics.median(times)

  return dict(peaks({name: median(run) for name, run in peak_runs().items()}), repeats=repeats)


def weight_counts(m) -> dict:
  """Matmul weights of a dense model config: per layer (attention, MLP), head, adapter."""
  attn = 2 * m.d_model * m.n_heads * m.head_dim + 2 * m.d_model * m.n_kv_heads * m.head_dim
  adapter = 3 * m.d_model * (m.residual_hidden or m.d_model) if m.residual_mode == "adapter" else 0
  return dict(layer=attn + 3 * m.d_model * m.mlp_dim, kv=2 * m.d_model * m.n_kv_heads * m.head_dim,
              head=m.vocab_size * m.d_model, adapter=adapter)


def weight_bytes(m) -> int:
  """f32 bytes of the matmul weights a forward reads (the embedding is a gather)."""
  w = weight_counts(m)
  return 4 * (m.n_layers * w["layer"] + w["head"] + w["adapter"])


def forward_flops(m, n_tokens: int, n_keys: int, n_head: float, n_last: int | None = None) -> float:
  """Matmul FLOPs of one row's forward of `n_tokens` tokens: every layer's projections and MLP,
  attention scores and values against `n_keys` key slots, the last layer's queries, output and
  MLP at `n_last` tokens only (`keep`; its keys and values at all), the head at `n_head`
  positions (and the soft embedding of the residual there, z = softmax(logits) @ E)."""
  w = weight_counts(m)
  n_last = n_tokens if n_last is None else n_last
  qo_mlp = w["layer"] - w["kv"]
  attn = 4 * m.n_heads * m.head_dim * n_keys
  layer = lambda n_q: 2 * n_tokens * w["kv"] + n_q * (2 * qo_mlp + attn)
  head = 2 * n_head * w["head"] * (2 if m.residual_mode != "none" else 1)
  return (m.n_layers - 1) * layer(n_tokens) + layer(n_last) + head + 2 * n_tokens * w["adapter"]


def masked_positions(block: int, steps: float, blocks: float) -> float:
  """Head positions of `blocks` blocks decoded in `steps` denoising steps in all, each block's
  commits spread evenly over its steps: a block of s steps has b, b - b/s, ... masked, b(s+1)/2
  in all (a lower bound on what the masked head computes: it gathers into power-of-two widths)."""
  return block * (steps + blocks) / 2


def decode_work(m, kind: str, *, prompt_len: int, gen: int, block: int, denoise, ran,
                n_blocks, full_head: bool = False) -> dict:
  """{flops, bytes, batch_forwards} of one lock-step decode of B rows (counts per row [B]:
  `denoise` denoising forwards, `ran` forwards run, `n_blocks` blocks decoded).

  kind: "none" / "plain" (a bidirectional canvas forwarded whole every step), "dual" / "prefix"
  (Fast-dLLM: the whole canvas at each block start, then the block / the response window from the
  block on against the stored keys and values), "kv" (block-causal: the prompt's forward, then
  the block against the KV cache, and commit forwards). `full_head`: the head at every position
  its forward carries (the peer's decoders) instead of at the masked positions (ours)."""
  denoise, ran, n_blocks = (np.asarray(x, np.float64) for x in (denoise, ran, n_blocks))
  width, rows = prompt_len + gen, len(denoise)
  kv_row = 4 * m.n_layers * 2 * m.n_kv_heads * m.head_dim          # bytes per key slot
  masked = masked_positions(block, denoise, n_blocks)
  later = np.maximum(denoise - n_blocks, 0)                        # steps after a block's first
  if kind in ("none", "plain"):
    head = denoise * width if full_head else masked
    flops = denoise * forward_flops(m, width, width, 0, None if full_head else block)
    flops = flops + head * forward_flops(m, 0, 0, 1)
    kv_bytes = 0 * denoise
  elif kind in ("dual", "prefix"):
    n_q = block if kind == "dual" else gen
    first = n_blocks * forward_flops(m, width, width, 0, None if full_head else block)
    step = later * forward_flops(m, n_q, width + n_q, 0, None if full_head else block)
    head = (n_blocks * width + later * n_q) if full_head else masked
    flops = first + step + head * forward_flops(m, 0, 0, 1)
    kv_bytes = later * kv_row * width
  elif kind == "kv":
    cache = prompt_len + gen                                       # the cache's slots
    commits = ran - denoise
    flops = (forward_flops(m, prompt_len, cache, 0) + denoise * forward_flops(m, block, cache, 0)
             + commits * forward_flops(m, block, cache, 0)
             + (denoise * block if full_head else masked) * forward_flops(m, 0, 0, 1))
    kv_bytes = (denoise + commits) * kv_row * cache
  else:
    raise ValueError(f"unknown decode kind {kind!r}")
  batch_forwards = float(ran.max()) + (1.0 if kind == "kv" else 0.0)
  return dict(flops=float(flops.sum()), batch_forwards=batch_forwards,
              bytes=batch_forwards * weight_bytes(m) + float(kv_bytes.sum()), rows=rows)


def fractions(work: dict, seconds: float, peaks: dict) -> dict:
  """The decode's share of the machine's FLOP and bandwidth bounds at `seconds` per decode."""
  return dict(flops=work["flops"], bytes=work["bytes"],
              gflop_s=work["flops"] / seconds / 1e9, gb_s=work["bytes"] / seconds / 1e9,
              flop_bound_fraction=work["flops"] / seconds / (peaks["matmul_gflop_s"] * 1e9),
              bandwidth_bound_fraction=work["bytes"] / seconds / (peaks["bandwidth_gb_s"] * 1e9))


def xla_flops(compiled) -> float:
  """XLA's FLOP count of a compiled program (a loop body once, a `switch` at its widest branch)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", math.nan))
