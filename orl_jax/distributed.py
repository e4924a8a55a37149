"""Multi-host start-up (docs/scaling.md#meshes-and-sharding): `jax.distributed.initialize()` when
the config or the environment asks for it; a no-op on one host and in Colab.

`config.distributed.mode`:
* ``"auto"`` (default) — initialise when the environment describes a multi-process job: explicit
  coordinator variables (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`; JAX
  reads only the first itself, so the other two are passed on), a SLURM job with more than one
  task, or a multi-host TPU slice (`TPU_WORKER_HOSTNAMES` with several hosts), whose details
  JAX's cluster detection reads.
* ``"on"`` — always initialise (with `coordinator`, `num_processes`, `process_id` when set).
* ``"off"`` — never.
Must run before anything touches a JAX backend.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import jax
import numpy as np


def _env_multiprocess(env) -> str | None:
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "coordinator variables"
  if int(env.get("SLURM_NTASKS", "1") or 1) > 1:
    return "SLURM"
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
  if len(hosts) > 1:
    return "TPU pod slice"
  return None


def should_initialize(dist_cfg, env=None) -> tuple[bool, str]:
  env = os.environ if env is None else env
  mode = dist_cfg.mode if dist_cfg is not None else "auto"
  if mode == "off":
    return False, "distributed.mode='off'"
  if mode == "on":
    return True, "distributed.mode='on'"
  if mode != "auto":
    raise ValueError(f"distributed.mode must be auto, on or off; got {mode!r}")
  why = _env_multiprocess(env)
  return (why is not None), (why or "single process")


def initialize_kwargs(dist_cfg, env=None) -> dict:
  """Arguments for `jax.distributed.initialize`: the config's coordinator, else the
  `JAX_COORDINATOR_ADDRESS`/`JAX_NUM_PROCESSES`/`JAX_PROCESS_ID` variables, else none (JAX
  detects SLURM, TPU pods and other clusters)."""
  env = os.environ if env is None else env
  if dist_cfg is not None and dist_cfg.get("coordinator"):
    return dict(coordinator_address=dist_cfg.coordinator,
                num_processes=dist_cfg.num_processes, process_id=dist_cfg.process_id)
  if not env.get("JAX_COORDINATOR_ADDRESS"):
    return {}
  kwargs = {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"]}
  for name, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
    if env.get(name):
      try:
        kwargs[key] = int(env[name])
      except ValueError:
        raise ValueError(f"{name}={env[name]!r} must be an integer") from None
  return kwargs


def maybe_initialize(dist_cfg=None, env=None) -> dict:
  """Initialises the distributed runtime if asked; returns process/device counts for logging."""
  ok, why = should_initialize(dist_cfg, env)
  if ok:
    jax.distributed.initialize(**initialize_kwargs(dist_cfg, env))
  info = {"reason": why, "process_index": jax.process_index(),
          "process_count": jax.process_count(), "local_devices": jax.local_device_count(),
          "global_devices": jax.device_count(), "platform": jax.default_backend()}
  logging.info("process %d/%d, %d local / %d global %s devices (%s)", info["process_index"],
               info["process_count"], info["local_devices"], info["global_devices"],
               info["platform"], why)
  return info


def is_lead_process() -> bool:
  """Only process 0 writes logs, plots and configs (every process checkpoints)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches `name` (e.g. process 0's files are written)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def share(n: int, index: int, count: int) -> list[int]:
  """The items of `n` that process `index` of `count` scores: i, i + count, ... (strided, so
  the G consecutive responses of one prompt -- which often cost alike: a hard problem's
  responses all run to the sandbox's limit -- are spread over the processes)."""
  return list(range(index, n, count))


def shared_scores(score: Callable[[list[int]], Sequence[float]], n: int,
                  dtype=np.float32) -> np.ndarray:
  """[n] scores of items 0..n-1, each process scoring only its `share` (`score(indices)` ->
  their scores) and the shares gathered, so every process returns the same array (a verifier
  that is not deterministic cannot give the processes different rewards). One process: all of
  them, in one call."""
  mine = my_share(n)
  return gather_shares(score(mine) if mine else [], n, dtype)


def my_share(n: int) -> list[int]:
  """This process's `share` of `n` items (all of them with one process)."""
  return share(n, jax.process_index(), jax.process_count())


def gather_shares(local: Sequence[float], n: int, dtype=np.float32) -> np.ndarray:
  """[n]: every process's scores of its `my_share(n)` items (`local`, in share order) put in
  place, the same array on every process. A collective with several processes: every process
  calls it, in the same order."""
  count = jax.process_count()
  if count == 1:
    return np.asarray(local, dtype).reshape(n)
  padded = np.zeros(-(-n // count), dtype)           # [ceil(n / count)], padded to equal length
  padded[:len(local)] = local
  from jax.experimental import multihost_utils
  gathered = np.asarray(multihost_utils.process_allgather(padded))   # [count, ceil(n / count)]
  scores = np.empty(n, dtype)
  for p in range(count):
    part = share(n, p, count)
    scores[part] = gathered[p, :len(part)]
  return scores
