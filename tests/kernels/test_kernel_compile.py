"""The staircase kernels compiled, not only lowered, by the real compilers on this CPU host
(`make compilers`): libtpu's Mosaic for a TPU v5e, XLA's GPU compiler (Triton) for an H100, at
one real shape (LLaDA2.1-mini's GQA attention, head_dim 128, bf16, one 4k packed row, traced
metadata). Each platform's cases compile in one subprocess (tests/scripts/compiled_kernels.py),
which sets the compiler up before JAX starts; the rest of the suite never loads it.

The whole kernel x shape x chip sweep is `benchmarks/kernel_compile.py`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orl_jax.aot import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _compiled(platform: str) -> dict:
  out = subprocess.run([sys.executable, "tests/scripts/compiled_kernels.py", platform], cwd=ROOT,
                       capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def _dense_flops(shape: kernels.AttentionShape, seq_len: int, tile: int) -> int:
  """The three kernels' FLOPs by hand under a trace, where every tile pair counts: per pair
  and query head, 2 x tile^2 x head_dim per matmul; forward 2 matmuls, dq 3, dk/dv 4."""
  pairs = (seq_len // tile) ** 2 * shape.heads_q
  return (2 + 3 + 4) * 2 * tile * tile * shape.head_dim * pairs


@pytest.fixture(scope="module")
def tpu_results():
  return _compiled("tpu")


def test_tpu_kernels_compile_for_v5e_with_their_vmem(tpu_results):
  """Mosaic accepts the block-sparse kernel and splash, forward and backward, at the tiles
  the project runs them with; each kernel's scoped VMEM is read from the compiled module."""
  want_kernels = {"pallas": {"staircase_fwd", "staircase_dq", "staircase_dkdv"},
                  "splash": {"splash_mqa_fwd_residuals", "splash_mqa_dq_no_residuals",
                             "splash_mqa_dkv_no_residuals"}}
  for name, kernel_names in want_kernels.items():
    r = tpu_results[name]
    assert r["accepted"], r["error"]
    assert set(r["fast_memory"]) == kernel_names, r["fast_memory"]
    # a kernel's VMEM holds at least its double-buffered q, k and v tiles (bf16 128 x 128)
    assert all(3 * 2 * 128 * 128 * 2 <= b < 16 * 2**20 for b in r["fast_memory"].values()), r


def test_tpu_cost_analysis_counts_the_block_sparse_kernels(tpu_results):
  """The compiler's FLOPs of the pallas program are the kernels' cost estimates (and little
  else): a train step's cost analysis counts attention."""
  r = tpu_results["pallas"]
  want = _dense_flops(kernels.SHAPES["llada2.1-mini"], 4096, 128)
  assert want <= r["flops"] <= 1.01 * want, (r["flops"], want)


def test_a_kernel_whose_tiles_overflow_vmem_is_refused_in_one_paragraph(tpu_results):
  r = tpu_results["oversized"]
  assert not r["accepted"]
  assert r["limit_bytes"] > 0 and r["fast_memory"]["staircase_fwd"] > r["limit_bytes"], r
  paragraph = r["error"]
  assert "\n" not in paragraph and "does not compile for v5e:2x2" in paragraph, paragraph
  assert "staircase_fwd needs" in paragraph and "of the TensorCore's VMEM" in paragraph
  assert "Smaller kernel tiles" in paragraph


def test_gpu_kernel_compiles_for_h100_with_its_shared_memory():
  """XLA's GPU compiler turns the Triton kernel into H100 code; the shared memory of its
  launch is read from the compiler's thunk sequence (within an H100 block's 227 KiB)."""
  r = _compiled("cuda")["pallas"]
  assert r["accepted"], r["error"]
  assert 0 < r["fast_memory"]["staircase_fwd_gpu"] <= 232448, r
