"""Run untrusted Python in a contained process tree, and judge functions without trusting them.

A sibling of `orl_jax` that imports only the standard library (its runner executes as a bare
script inside the sandbox). `launcher` starts runs, `runner` is the sandbox's own processes,
`judge` the tests' side of a judged run, `wire` the typed data codec between judge and sample.
"""
from orl_sandbox.launcher import (ALLOW_WEAK_ENV, ESSENTIAL_LAYERS, SandboxLimits, SandboxResult,
                                  SandboxUnavailableError, claim_exclusive, isolation_required,
                                  missing_essentials, probe_isolation, release_exclusive,
                                  run_judged, run_python)
