"""The accelerator path lowered on a CPU host (DESIGN §8): what a TPU or a GPU would compile.

Every kernel, forward and forward+backward, is exported for its platform (Pallas TPU and splash
for `tpu`, Pallas GPU for `cuda`) at paper-like shapes (head_dim 64 and 128, f32 and bf16, one
8k packed row) with JAX's default flags, and the lowered module must hold the kernel's custom
calls: one per `pallas_call` (forward; dq; dk/dv), none replaced by a dense fallback.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.staircase_attention import TokenMeta, attention, gpu, splash, tpu
from pallas_kernels.staircase_attention.lowering import KERNEL_CALLS, custom_calls, lowered_text

# kernel -> (platform, fn(q, k, v, q_meta, k_meta))
KERNELS = {
    "pallas-tpu": ("tpu", tpu.staircase_attention),
    "pallas-gpu": ("cuda", gpu.staircase_attention),
    "splash": ("tpu", splash.staircase_attention),
}
# (seq_len, Hq, Hkv, head_dim, dtype): one 8k packed row, GQA and MHA
SHAPES = {
    "8k-d64-f32-gqa": (8192, 4, 2, 64, jnp.float32),
    "8k-d128-bf16": (8192, 2, 2, 128, jnp.bfloat16),
}


def _operands(seq_len, hq, hkv, dh, dtype):
  spec = jax.ShapeDtypeStruct
  meta = [spec((1, seq_len), jnp.int32)] * len(TokenMeta._fields)
  return [spec((1, seq_len, hq, dh), dtype), spec((1, seq_len, hkv, dh), dtype),
          spec((1, seq_len, hkv, dh), dtype), *meta]


def _forward(kernel):
  def fn(q, k, v, *meta):
    meta = TokenMeta(*meta)
    return kernel(q, k, v, meta, meta)
  return fn


def _forward_backward(kernel):
  def fn(q, k, v, *meta):
    meta = TokenMeta(*meta)
    loss = lambda q, k, v: jnp.sum(kernel(q, k, v, meta, meta).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  return fn


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_kernel_lowers_for_its_platform(kernel, pass_, shape):
  platform, fn = KERNELS[kernel]
  wrap = _forward if pass_ == "fwd" else _forward_backward
  text = lowered_text(wrap(fn), *_operands(*SHAPES[shape]), platform=platform)
  calls = custom_calls(text)
  # forward: one kernel; backward adds the dq and dk/dv kernels
  assert calls[KERNEL_CALLS[platform]] == (1 if pass_ == "fwd" else 3), calls
  assert not any("mosaic_gpu" in name for name in calls), calls  # Triton, not Mosaic GPU


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_dispatch_auto_lowers_to_the_platform_kernel(platform):
  """`impl="auto"` traced for the target picks its kernel (splash on TPU, Triton on GPU)."""
  auto = lambda q, k, v, q_meta, k_meta: attention(q, k, v, q_meta, k_meta, impl="auto")
  text = lowered_text(_forward_backward(auto),
                      *_operands(*SHAPES["8k-d128-bf16"]), platform=platform)
  assert custom_calls(text)[KERNEL_CALLS[platform]] == 3
