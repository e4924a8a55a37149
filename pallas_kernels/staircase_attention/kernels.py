"""Registers the Pallas staircase kernels with the attention dispatch (imported lazily by it).

* ``pallas`` — the TPU (Mosaic) kernel on TPU, the Triton kernel on GPU, and the TPU-style
  kernel in interpret mode anywhere else (CPU: for tests, not speed);
* ``splash`` — TPU splash attention with the staircase mask (interpret mode off TPU).
"""
from __future__ import annotations

import jax

from pallas_kernels.staircase_attention import gpu, splash, tpu
from pallas_kernels.staircase_attention.dispatch import register_kernel


def pallas_attention(q, k, v, q_meta, k_meta, scale):
  platform = jax.default_backend()
  if platform == "tpu":
    return tpu.staircase_attention(q, k, v, q_meta, k_meta, scale)
  if platform == "gpu":
    return gpu.staircase_attention(q, k, v, q_meta, k_meta, scale)
  return tpu.staircase_attention(q, k, v, q_meta, k_meta, scale, interpret=True)


def splash_attention(q, k, v, q_meta, k_meta, scale):
  return splash.staircase_attention(q, k, v, q_meta, k_meta, scale,
                                    interpret=jax.default_backend() != "tpu")


register_kernel("pallas", pallas_attention)
register_kernel("splash", splash_attention)
