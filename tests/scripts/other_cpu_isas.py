"""Which XLA CPU instruction-set caps change this host's floating-point results.

    python tests/scripts/other_cpu_isas.py SSE4_2 AVX2   # prints, one per line, the caps that
                                                         # differ

`make test-other-cpu` runs the `numerics` tests under the caps this prints. A cap changes results
when XLA then emits other vector widths, no fused multiply-add, or other dot kernels: reductions
and dots round differently, which is what a test that depends on one machine's rounding trips
over. Each
cap runs a fixed probe (dots of decode-like shapes, softmax, log-softmax, a reduction, GELU,
an attention einsum) in a fresh process with `XLA_FLAGS=--xla_cpu_max_isa=<cap>`; a cap is
printed when the probe's bytes differ from the host default's. A cap this host does not have
(or XLA does not know) is reported on stderr and skipped.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

CAP_FLAG = "--xla_cpu_max_isa="


def probe_digest() -> str:
  """A digest of the probe's outputs under the current XLA_FLAGS (run in a fresh process)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  jax.config.update("jax_platforms", "cpu")
  key = jax.random.PRNGKey(0)
  outputs = []
  for m, n, p in [(1, 64, 128), (8, 128, 1000), (64, 512, 4096), (3, 17, 33)]:
    a = jax.random.normal(key, (m, n), jnp.float32)
    b = jax.random.normal(jax.random.fold_in(key, 1), (n, p), jnp.float32)

    @jax.jit
    def f(a, b):
      x = a @ b                                            # [m, p]
      return (x, jax.nn.softmax(x, -1), jax.nn.log_softmax(x, -1),
              jnp.sum(jnp.exp(x * 0.01) * jnp.log1p(jnp.abs(x)), -1), jax.nn.gelu(x))
    outputs += f(a, b)
  q = jax.random.normal(key, (4, 16, 64, 32))              # [B, H, T, D]
  outputs.append(jax.jit(lambda q: jnp.einsum("bhqd,bhkd->bhqk", q, q))(q))
  h = hashlib.sha256()
  for o in outputs:
    h.update(np.asarray(o).tobytes())
  return h.hexdigest()


def digest_under(cap: str | None) -> str | None:
  """The probe's digest with XLA's CPU code generator capped at `cap` (None: host default);
  None when the process fails (a cap this host or this XLA does not support)."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(CAP_FLAG)]
  env["XLA_FLAGS"] = " ".join(flags + ([CAP_FLAG + cap] if cap else []))
  env.setdefault("JAX_PLATFORMS", "cpu")
  run = subprocess.run([sys.executable, __file__, "--probe"], env=env, capture_output=True,
                       text=True)
  lines = run.stdout.split()
  return lines[-1] if run.returncode == 0 and lines else None


def differing_caps(caps: list[str]) -> list[str]:
  """The caps of `caps` whose probe results differ from the host default's."""
  host = digest_under(None)
  if host is None:
    raise SystemExit("other_cpu_isas.py: the probe failed under the host default; run "
                     f"`{sys.executable} {__file__} --probe` to see why.")
  out = []
  for cap in caps:
    got = digest_under(cap)
    if got is None:
      print(f"other_cpu_isas.py: {CAP_FLAG}{cap} does not run here; skipped", file=sys.stderr)
    elif got != host:
      out.append(cap)
  return out


if __name__ == "__main__":
  if sys.argv[1:] == ["--probe"]:
    print(probe_digest())
  else:
    print("\n".join(differing_caps(sys.argv[1:])))
