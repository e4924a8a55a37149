"""One attention entry point: `attention(q, k, v, q_meta, k_meta, impl=..., mesh=...)`
(docs/scaling.md#attention-kernels-and-accelerators).

`impl`:
* ``xla``    — dense mask from the metadata (the reference; always available);
* ``pallas`` — the Pallas staircase kernel of the platform (TPU Mosaic / GPU Triton; on CPU the
  TPU-style kernel in interpret mode, which is for tests, not speed);
* ``splash`` — TPU splash attention with the staircase mask (interpret mode on CPU);
* ``auto``   — on TPU splash, else (a case splash cannot run, or traced metadata for which
  splash would store a dense mask larger than `splash.TRACED_MASK_LIMIT_BYTES` per row) the
  Pallas kernel; on GPU the Pallas kernel; ``xla`` elsewhere.

Kernels come from `KERNELS`, a table this module builds from the kernel modules (which know
nothing of it). An explicitly chosen kernel that cannot run (none for the platform, or a case it
does not support) raises a ValueError saying why; ``auto`` falls back to ``xla`` and warns once
per reason (loud, never silent).

The platform is the one the computation is traced for: this host's backend, or the one set by
`target_platform` while lowering for another platform (`lowering.lowered_text`).

With a `mesh`, a kernel runs inside `jax.shard_map`: rows split over the mesh's batch axes
(`data`, `fsdp`), heads over `tensor`. XLA cannot partition a kernel's custom call; outside a
`shard_map` it would gather or replicate the kernel's operands.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, NamedTuple

import jax
from jax.sharding import PartitionSpec as P

from pallas_kernels.platform import current_platform, target_platform  # noqa: F401 (re-export)
from pallas_kernels.staircase_attention import gpu, splash, tpu
from pallas_kernels.staircase_attention.meta import TokenMeta
from pallas_kernels.staircase_attention.reference import staircase_attention_reference

IMPLS = ("auto", "xla", "pallas", "splash")
BATCH_AXES = ("data", "fsdp", "expert")   # orl_jax.sharding.BATCH_AXES
HEAD_AXIS = "tensor"


class Kernel(NamedTuple):
  run: Callable          # (q, k, v, q_meta, k_meta, scale[, window=]) -> out, like q
  unsupported: Callable  # (q, k, v) -> a reason it cannot run, or None
  auto_skip: Callable | None = None  # (q, k, q_meta, k_meta) -> why `auto` should rather take
                                     # the next kernel (it can run, at a cost), or None


# (impl, platform) -> Kernel. Platforms as `jax.default_backend()` names them (`gpu` for CUDA).
KERNELS = {
    ("pallas", "tpu"): Kernel(tpu.staircase_attention, tpu.unsupported),
    ("pallas", "gpu"): Kernel(gpu.staircase_attention, gpu.unsupported),
    ("pallas", "cpu"): Kernel(functools.partial(tpu.staircase_attention, interpret=True),
                              tpu.unsupported),
    ("splash", "tpu"): Kernel(splash.staircase_attention, splash.unsupported,
                              auto_skip=splash.dense_mask_too_large),
    ("splash", "cpu"): Kernel(functools.partial(splash.staircase_attention, interpret=True),
                              splash.unsupported, auto_skip=splash.dense_mask_too_large),
}
AUTO = {"tpu": ("splash", "pallas"), "gpu": ("pallas",)}  # platform -> impls tried; else xla

# The fallback warnings logged so far: each is logged once per process; clear the set to have
# them logged again (a process that traces for another target).
warned: set[str] = set()


def _warn_once(msg: str) -> None:
  if msg not in warned:
    warned.add(msg)
    logging.warning(msg)


def _kernel(impl: str, platform: str, q, k, v, window: int = 0,
            auto_meta: tuple | None = None) -> tuple[Callable | None, str | None]:
  """(the kernel's run function, None) or (None, why it cannot run); with `auto_meta`
  (q_meta, k_meta: chosen by `auto`) also None when the kernel asks to be passed over."""
  kernel = KERNELS.get((impl, platform))
  if kernel is None:
    where = sorted(p for i, p in KERNELS if i == impl)
    return None, f"no {impl!r} kernel for platform {platform!r} (it has: {', '.join(where)})"
  reason = kernel.unsupported(q, k, v)
  if not reason and auto_meta is not None and kernel.auto_skip is not None:
    reason = kernel.auto_skip(q, k, *auto_meta)
  if reason:
    return None, reason
  return (functools.partial(kernel.run, window=window) if window else kernel.run), None


def _split_axes(mesh, names, size: int) -> tuple[str, ...]:
  """The axes among `names` (in order) that split a dimension of `size` evenly."""
  axes, ways = [], 1
  for name in names:
    n = dict(mesh.shape).get(name, 1)
    if n > 1 and size % (ways * n) == 0:
      axes.append(name)
      ways *= n
  return tuple(axes)


def _sharded(run: Callable, mesh, q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, scale):
  """`run` per device inside `shard_map`: rows over the batch axes, heads over `tensor`. When
  neither divides (one prompt decoded on a mesh of several devices), every device runs the
  whole kernel on replicated operands: outside a `shard_map` the partitioner would refuse the
  kernel ("Mosaic kernels cannot be automatically partitioned")."""
  rows = _split_axes(mesh, BATCH_AXES, q.shape[0]) or None
  heads = _split_axes(mesh, (HEAD_AXIS,), k.shape[2]) or None
  if rows is None and heads is None and mesh.size == 1:
    return run(q, k, v, q_meta, k_meta, scale)
  x, ids = P(rows, None, heads, None), P(rows, None)
  local = lambda q, k, v, q_meta, k_meta: run(q, k, v, q_meta, k_meta, scale)
  return jax.shard_map(local, mesh=mesh, in_specs=(x, x, x, ids, ids), out_specs=x,
                       check_vma=False)(q, k, v, q_meta, k_meta)


def attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *, impl: str = "auto",
              scale: float | None = None, mesh=None, window: int = 0):
  """Staircase-masked attention. q: [B, Tq, Hq, Dh]; k, v: [B, Tk, Hkv, Dh]; metadata [B, T];
  `window` > 0: the rule's sliding window over context keys (`meta.staircase_visible`)."""
  if impl not in IMPLS:
    raise ValueError(f"attention impl must be one of {IMPLS}, got {impl!r}")
  platform = current_platform()
  if impl == "xla" or (impl == "auto" and platform not in AUTO):
    return staircase_attention_reference(q, k, v, q_meta, k_meta, scale=scale, window=window)
  reasons = []
  for chosen in AUTO[platform] if impl == "auto" else (impl,):
    run, reason = _kernel(chosen, platform, q, k, v, window,
                          (q_meta, k_meta) if impl == "auto" else None)
    if run is not None:
      if mesh is None:
        return run(q, k, v, q_meta, k_meta, scale)
      return _sharded(run, mesh, q, k, v, q_meta, k_meta, scale)
    reasons.append(f"{chosen}: {reason}")
  if impl != "auto":
    raise ValueError(f"attention impl {impl!r} cannot run: {reason}. "
                     "Use impl='auto' (falls back to 'xla') or impl='xla'.")
  _warn_once(f"attention impl 'auto' found no kernel for this case on {platform} "
             f"({'; '.join(reasons)}); falling back to 'xla'.")
  return staircase_attention_reference(q, k, v, q_meta, k_meta, scale=scale, window=window)
