"""One attention entry point: `attention(q, k, v, q_meta, k_meta, impl=...)` (DESIGN §3).

`impl`:
* ``xla``    — dense mask from the metadata (the reference; always available);
* ``pallas`` — the Pallas staircase kernel for the current platform (TPU Mosaic / GPU Triton;
  on CPU it runs in interpret mode, which is for tests, not speed);
* ``splash`` — TPU splash attention with a computable staircase mask;
* ``auto``   — the fastest implementation for the platform.

A kernel that cannot handle a case returns ``None`` from its ``try_*`` function with a reason;
the dispatch then falls back to ``xla`` and warns once per reason (never silently).
"""
from __future__ import annotations

import logging
from typing import Callable

import jax

from pallas_kernels.staircase_attention.meta import TokenMeta
from pallas_kernels.staircase_attention.reference import staircase_attention_reference

IMPLS = ("auto", "xla", "pallas", "splash")

# name -> fn(q, k, v, q_meta, k_meta, scale) returning the output, or a string saying why not.
_KERNELS: dict[str, Callable] = {}
_warned: set[str] = set()


def register_kernel(name: str, fn: Callable) -> None:
  _KERNELS[name] = fn


def _warn_once(msg: str) -> None:
  if msg not in _warned:
    _warned.add(msg)
    logging.warning(msg)


def _auto_impl() -> str:
  platform = jax.default_backend()
  if platform == "tpu":
    return "splash"
  if platform == "gpu":
    return "pallas"
  return "xla"


def attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *, impl: str = "auto",
              scale: float | None = None):
  """Staircase-masked attention. q: [B, Tq, Hq, Dh]; k, v: [B, Tk, Hkv, Dh]."""
  if impl not in IMPLS:
    raise ValueError(f"attention impl must be one of {IMPLS}, got {impl!r}")
  chosen = _auto_impl() if impl == "auto" else impl
  if chosen != "xla":
    _load_kernels()
    fn = _KERNELS.get(chosen)
    if fn is None:
      _warn_once(f"attention impl {chosen!r} is not available; falling back to 'xla'.")
    else:
      out = fn(q, k, v, q_meta, k_meta, scale)
      if not isinstance(out, str):
        return out
      _warn_once(f"attention impl {chosen!r} cannot run this case ({out}); falling back to 'xla'.")
  return staircase_attention_reference(q, k, v, q_meta, k_meta, scale=scale)


def _load_kernels() -> None:
  """Imports the kernel modules, which call `register_kernel` (kept lazy: Pallas is heavy)."""
  try:
    import pallas_kernels.staircase_attention.kernels  # noqa: F401
  except ImportError as e:  # the kernels package is optional until it exists
    _warn_once(f"Pallas staircase kernels unavailable ({e}).")
