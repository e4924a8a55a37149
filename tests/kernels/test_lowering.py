"""The accelerator path lowered on a CPU host
(docs/scaling.md#compiling-for-tpus-and-gpus-you-do-not-have): what a TPU or a GPU would compile.

Every kernel, forward and forward+backward, is exported for its platform (Pallas TPU and splash
for `tpu`, Pallas GPU for `cuda`) at paper-like shapes (head_dim 64 and 128, f32 and bf16, one
8k packed row) with JAX's default flags, and the lowered module must hold the kernel's custom
calls: one per `pallas_call` (forward; dq; dk/dv), none replaced by a dense fallback.

The whole ORL train step and rollout decode step of the `:debug` configs are lowered the same
way on a 4-device data x fsdp mesh (tests/scripts/sharded_lowering.py, a subprocess).

Lowering stops before the compilers: tests/kernels/test_kernel_compile.py compiles the kernels with
libtpu (Mosaic) and XLA's GPU compiler (Triton), and benchmarks/kernel_compile.py sweeps every
kernel x paper shape x chip.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
  """`impl="auto"` traced for the target picks its kernel: on TPU the block-sparse Mosaic
  kernel, since with traced metadata splash would store a dense 256 MiB mask for this 8k row
  (`splash.dense_mask_too_large`); Triton on GPU."""
  auto = lambda q, k, v, q_meta, k_meta: attention(q, k, v, q_meta, k_meta, impl="auto")
  text = lowered_text(_forward_backward(auto),
                      *_operands(*SHAPES["8k-d128-bf16"]), platform=platform)
  assert custom_calls(text)[KERNEL_CALLS[platform]] == 3
  assert "staircase_fwd" in text and "splash" not in text


def _sharded_lowering(name: str) -> dict:
  """tests/scripts/sharded_lowering.py on 4 fake CPU devices (its own process: the device count)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, "tests/scripts/sharded_lowering.py", name, "tpu,cuda"],
                       cwd=root, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])[name]


@pytest.mark.parametrize("name", ["sdar", pytest.param("llada", marks=pytest.mark.slow)])
def test_train_and_decode_steps_lower_sharded(name):
  """The jitted ORL train step and rollout decode step of `<name>:debug` (head_dim 16) on a
  data=2 x fsdp=2 mesh with impl=auto, lowered for tpu and cuda: the kernels are in the module,
  every one of them inside a shard_map that splits its rows over data and fsdp (so XLA never
  gathers attention operands across the batch axes), and the sharded kernels (interpret mode)
  equal the unsharded dense reference."""
  result = _sharded_lowering(name)
  for platform in ("tpu", "cuda"):
    for step in ("decode", "train"):
      r = result[platform][step]
      assert r["kernel_calls"] >= 1, (platform, step, r)
      assert r["pallas_calls_rows_split"] == r["pallas_calls"] >= 1, (platform, step, r)
      assert r["all_gathers"] == 0, (platform, step, r)
  assert result["sharded_max_abs_err"] < 1e-4, result["sharded_max_abs_err"]
