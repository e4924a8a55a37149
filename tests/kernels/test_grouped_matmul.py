"""The grouped matmul of the MoE expert compute (`pallas_kernels.grouped_matmul`).

The Hopper kernels do not run on this host; their plumbing (the custom_vjp: which product
computes which gradient, the rows of no group) is checked with the primitives substituted by
`jax.lax` ones that write junk into the rows a kernel leaves unwritten, against
`jax.lax.ragged_dot` and its autodiff. The kernels themselves are compiled for an H100 by XLA's
GPU compiler (`make compilers`), beside an A100 where `jax.lax.ragged_dot` is expanded.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import grouped_matmul as gm
from pallas_kernels.platform import GpuTarget, target_platform

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JUNK = 7.0


def _unwritten_rows_junk(prims: gm.GroupedMatmul) -> gm.GroupedMatmul:
  """`prims` with the rows past sum(group_sizes) of its row outputs set to JUNK, as a kernel
  that never writes them may leave them."""
  def junk(fn):
    def run(a, b, gs):
      out = fn(a, b, gs)
      return jnp.where((jnp.arange(out.shape[0]) < jnp.sum(gs))[:, None], out, JUNK)
    return run
  return gm.GroupedMatmul(junk(prims.forward), junk(prims.lhs_grad), prims.rhs_grad)


def _operands(m=37, k=16, n=24, sizes=(5, 0, 11, 9)):
  keys = jax.random.split(jax.random.key(0), 3)
  lhs = jax.random.normal(keys[0], (m, k), jnp.float32)
  rhs = jax.random.normal(keys[1], (len(sizes), k, n), jnp.float32)
  d_out = jax.random.normal(keys[2], (m, n), jnp.float32)
  return lhs, rhs, jnp.array(sizes, jnp.int32), d_out     # 25 of 37 rows in groups


def test_custom_vjp_equals_ragged_dot_and_its_autodiff():
  lhs, rhs, gs, d_out = _operands()
  ours = gm.with_grad(_unwritten_rows_junk(gm.REFERENCE))
  want, want_vjp = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs), lhs, rhs)
  got, got_vjp = jax.vjp(lambda a, b: ours(a, b, gs), lhs, rhs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))
  assert float(jnp.max(jnp.abs(got[25:]))) == 0.0        # rows in no group: exactly 0
  for g, w in zip(got_vjp(d_out), want_vjp(d_out)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(w))))


def test_the_reference_rhs_gradient_is_a_per_group_sum_of_outer_products():
  """The product the transposed kernel stands for, by hand: d rhs_g = sum over g's rows."""
  lhs, rhs, gs, d_out = _operands()
  got = np.asarray(gm.REFERENCE.rhs_grad(lhs, d_out, gs))
  starts = np.concatenate([[0], np.cumsum(np.asarray(gs))])
  a, d = np.asarray(lhs, np.float64), np.asarray(d_out, np.float64)
  want = np.stack([a[s:e].T @ d[s:e] for s, e in zip(starts[:-1], starts[1:])])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("gpu,dtype,k,expected", [
    (GpuTarget((9, 0), 132), jnp.bfloat16, 128, "mosaic_gpu"),
    (GpuTarget((8, 0), 108), jnp.bfloat16, 128, "xla"),     # A100: no wgmma
    (GpuTarget((9, 0), 132), jnp.float32, 128, "xla"),      # the kernels take bf16 / f16
    (GpuTarget((9, 0), 132), jnp.bfloat16, 40, "xla"),      # K not a multiple of the tile
])
def test_the_platform_picks_the_kernels_only_where_they_run(gpu, dtype, k, expected, caplog):
  lhs = jax.ShapeDtypeStruct((256, k), dtype)
  rhs = jax.ShapeDtypeStruct((4, k, 128), dtype)
  gm.warned.clear()
  with target_platform("cuda", gpu), caplog.at_level(logging.WARNING):
    name, prims = gm.implementation(lhs, rhs)
  assert name == expected and (prims is None) == (expected == "xla")
  assert ("jax.lax.ragged_dot" in caplog.text) == (expected == "xla")
  assert gm.implementation(lhs, rhs)[0] == "xla"          # this host: jax.lax.ragged_dot


@pytest.mark.accelerator_compile
def test_moe_experts_compile_for_h100_with_the_kernels_and_without_the_expansion():
  """LLaDA2.1-mini's expert sizes, forward + backward: on an H100 the nine products are Mosaic
  GPU kernels and the temporaries stay below what one expanded product needs; an A100 compiles
  `jax.lax.ragged_dot`, expanded over every expert."""
  out = subprocess.run([sys.executable, "tests/scripts/compiled_grouped_matmul.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  assert r["h100"]["mosaic_gpu_calls"] == 9 and r["a100"]["mosaic_gpu_calls"] == 0
  one_expanded = 32 * 2048 * 8 * 512 * 2           # [E, tokens*top_k, F] bf16: 512 MiB
  assert r["h100"]["temp_bytes"] < one_expanded < r["a100"]["temp_bytes"], r
