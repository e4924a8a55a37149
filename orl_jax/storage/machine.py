"""The machine a training ran on, as a params folder's `meta.json` records it (`machine`).

XLA:CPU compiles other kernels for other instruction sets and core counts, so the last bits of
a training depend on where it ran; what decides them is recorded beside the parameters so that
a re-run can tell whether it should be bit-identical
(docs/training.md#reproducing-the-tiny-models).
"""
from __future__ import annotations

import os
import platform

import jax

# Instruction sets that change the kernels XLA:CPU emits (and so the last bits of the results).
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_tile", "asimd", "sve")
# The fields of a record that decide bit-identical training (the others are for people).
DECIDING = ("cpu", "cores", "cpu_flags", "xla_flags", "jax", "jaxlib")


def _cpu() -> tuple[str, list[str]]:
  """(model name, the instruction sets of CPU_FLAGS it has) from /proc/cpuinfo; ("", []) where
  there is none."""
  model, flags = "", list[str]()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
          model = value.strip()
        if key.strip() in ("flags", "Features") and not flags:
          flags = sorted(set(value.split()) & set(CPU_FLAGS))
  except OSError:
    pass
  return model, flags


def machine() -> dict:
  """What decides whether a re-run can be bit-identical: the CPU, the cores this process may
  use, the XLA flags and the JAX versions (plus the device, Python and OS, for people)."""
  import jaxlib
  model, flags = _cpu()
  model = model or platform.processor() or platform.machine()
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"cpu": model, "cores": cores, "cpu_flags": flags,
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "device": jax.devices()[0].device_kind,
          "python": platform.python_version(), "os": f"{platform.system()} {platform.release()}"}


def same_machine(a: dict | None, b: dict | None) -> bool:
  """Whether two machine records promise bit-identical training."""
  return bool(a and b and all(a.get(k) == b.get(k) for k in DECIDING))
