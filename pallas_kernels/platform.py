"""The platform a computation is traced for: this host's backend, or a compile target's.

Kernels pick their implementation at trace time from `current_platform()` (and, on GPU,
`current_gpu()`: which generation, how many SMs). The compile command (`orl_jax.aot`) traces for
an accelerator this host does not have inside `target_platform(...)`, giving the GPU's
description from its target file (`GpuTarget`); on a real accelerator both come from the device.
"""
from __future__ import annotations

import contextlib
import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """What a GPU kernel needs to know of its GPU."""
  compute_capability: tuple[int, int]   # (9, 0): Hopper
  sm_count: int                         # streaming multiprocessors (132: H100 / H200 SXM)


_target: list[tuple[str, GpuTarget | None]] = []


@contextlib.contextmanager
def target_platform(platform: str, gpu: GpuTarget | None = None):
  """Traces for `platform` (`tpu`, `cuda`, `gpu`, `cpu`) instead of this host's; `gpu` describes
  the GPU of a `cuda` target.

  `jit` caches traces without knowing this setting, so the caches are cleared on entry and exit
  (a function traced for the host is retraced for the target, and the other way round).
  """
  jax.clear_caches()
  _target.append((platform, gpu))
  try:
    yield
  finally:
    _target.pop()
    jax.clear_caches()


def current_platform() -> str:
  """`tpu`, `gpu` (CUDA or ROCm) or `cpu`: the platform being traced for."""
  platform = _target[-1][0] if _target else jax.default_backend()
  return "gpu" if platform in ("cuda", "rocm") else platform


def current_gpu() -> GpuTarget | None:
  """The GPU being traced for: the target's (inside `target_platform`), else this host's first
  device when it is an NVIDIA GPU; None when neither says."""
  if _target:
    return _target[-1][1]
  device = jax.devices()[0]
  capability = getattr(device, "compute_capability", None)
  if device.platform != "gpu" or not capability:
    return None
  major, _, minor = str(capability).partition(".")
  return GpuTarget((int(major), int(minor or 0)), int(getattr(device, "core_count", 0) or 0))
