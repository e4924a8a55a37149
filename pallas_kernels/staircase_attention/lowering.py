"""Lowering a jitted function for a TPU or a GPU on any host, CPU included
(docs/scaling.md#compiling-for-tpus-and-gpus-you-do-not-have).

`jax.export` with `platforms=[...]` runs the real kernel lowering (Mosaic TPU, Triton) and emits
the module a device would compile, so kernel and sharding bugs show up without the device.
Kernel custom calls (and `ragged_all_to_all`) are not in export's list of stable targets; they
are allowed explicitly.
"""
from __future__ import annotations

import collections
import re

import jax
from jax import export

from pallas_kernels.staircase_attention.dispatch import target_platform

# The custom call each platform's kernels lower to.
KERNEL_CALLS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
# Collectives that lower to custom calls (the MoE token exchange, orl_jax/models/moe.py).
COLLECTIVE_CALLS = ("ragged_all_to_all",)
_CALL = re.compile(r"stablehlo\.custom_call @([\w$.]+)\(")


def lowered_text(fn, *args, platform: str) -> str:
  """The StableHLO text of `jax.jit(fn)` (or a jitted `fn`) lowered for `platform`.

  `args` are arrays or `jax.ShapeDtypeStruct`s (with shardings for a sharded lowering). The
  attention dispatch picks its kernels for `platform` meanwhile (`impl="auto"` as on the device).
  """
  checks = [export.DisabledSafetyCheck.custom_call(name)
            for name in (*KERNEL_CALLS.values(), *COLLECTIVE_CALLS)]
  jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
  with target_platform(platform):
    exported = export.export(jitted, platforms=[platform], disabled_checks=checks)(*args)
  return exported.mlir_module()


def custom_calls(module_text: str) -> collections.Counter:
  """How many times each custom-call target occurs in a lowered module."""
  return collections.Counter(_CALL.findall(module_text))
