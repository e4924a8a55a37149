"""Compiler options by the size of a decoder's steps: on CPU, steps of few tokens compile
without XLA:CPU's YNNPACK fusions (`step_compiler_options`); `StepSizedJit` jits a decoder with
the options its call's batch implies."""

from __future__ import annotations

import functools

import jax

from pallas_kernels.staircase_attention import current_platform


# XLA:CPU's YNNPACK dot fusions pack the weights on every call, which decode steps of few tokens
# do not amortise; XLA's own dot emitter is then faster. Measured on 2 cores, 60M LLaDA,
# decode.cache=dual, whole decodes: 1.33x faster without them at batch 1 (8 tokens a step),
# 1.16x at batch 4, equal at batch 8 (64 tokens), 0.86x at batch 16, 0.94x at batch 64.
SMALL_STEP_TOKENS = 64


_SMALL_STEP_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def cpu_accepts(option: str) -> bool:
  """This jaxlib's XLA:CPU knows the debug option (an experimental one may go away)."""
  try:
    jax.jit(lambda x: x + 1, compiler_options={option: ""}).lower(1.0).compile()
    return True
  except Exception:  # noqa: BLE001 - any refusal means: compile without it
    return False


def step_compiler_options(step_tokens: int) -> dict | None:
  """Compiler options for a decoder whose steps forward `step_tokens` tokens (rows x block):
  on CPU, no YNNPACK fusions up to SMALL_STEP_TOKENS; elsewhere (also when compiling for an
  accelerator on a CPU host), and above, XLA's defaults."""
  if current_platform() != "cpu" or step_tokens > SMALL_STEP_TOKENS:
    return None
  if not all(cpu_accepts(k) for k in _SMALL_STEP_CPU_OPTIONS):
    return None
  return dict(_SMALL_STEP_CPU_OPTIONS)


class StepSizedJit:
  """`jax.jit(fn)` compiled with `step_compiler_options` for the step size a call implies:
  `fn(state, tokens [R, ...], *rest)`, steps of `rows(R) x block_size` tokens. Called, or
  `.lower(...)` for ahead-of-time compilation, like the jitted function itself."""

  def __init__(self, fn, block_size: int, rows=lambda n: n):
    self._fn, self._block, self._rows = fn, block_size, rows
    self._jits: dict = {}

  def jitted(self, n: int, nested: bool = False):
    """The jitted function for calls whose tokens have `n` rows (`nested`: inside another
    trace, where XLA takes no per-call options)."""
    opts = None if nested else step_compiler_options(self._rows(n) * self._block)
    key = tuple(sorted(opts.items())) if opts else ()
    if key not in self._jits:
      self._jits[key] = jax.jit(self._fn, compiler_options=opts)
    return self._jits[key]

  def __call__(self, state, tokens, *rest):
    nested = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((state, tokens, rest)))
    return self.jitted(tokens.shape[0], nested)(state, tokens, *rest)

  def lower(self, state, tokens, *rest):
    return self.jitted(tokens.shape[0]).lower(state, tokens, *rest)
