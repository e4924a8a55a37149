"""The life of a training run, shared by every loop (`sft.py`, `orl.py`), after its set-up
(`orl_jax.setup.build.build_setup`): `prepare_run` (optimizer, sharded state, checkpoint
manager recording the run's settings), `resume` (the newest checkpoint that restores),
`finish_run` (export the final parameters) and `RunLog` (the progress bar and metrics file)."""
from __future__ import annotations

import json
import os
from typing import Any

from tqdm import tqdm   # text bars: also in notebooks, where widgets may not render

from orl_jax.config import derive as config_lib
from orl_jax import distributed
from orl_jax.models import params_io
from orl_jax.storage import machine as machine_lib
from orl_jax.storage import run_settings as run_settings_lib
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax import sharding as sharding_lib
from orl_jax.storage.checkpoint import Checkpointer, abstract_like
from orl_jax.metrics import MetricsWriter
from orl_jax.setup.build import Setup, initial_params, params_meta
from orl_jax.setup.recorded import recorded_settings
from orl_jax.setup.resolve import needs_reference
from orl_jax.storage.hf_export import HF_EXPORT_DIR, export_hf_dir, export_model_type
from orl_jax.train.state import Run, create_train_state
from orl_jax.optimizer import optimizer_of


def prepare_run(setup: Setup) -> Run:
  """Records the config, builds the optimizer and the sharded train state (from the starting
  weights when there are any) and opens the work directory's checkpoint manager, which records
  the run's settings (`recorded_settings`) with each checkpoint and checks them on resume."""
  config = setup.config
  settings = recorded_settings(setup)
  allowed = run_settings_lib.allowed_fields(config.checkpoint.allow_changed, settings)
  found = tuple(sorted(os.listdir(config.workdir))) if os.path.isdir(config.workdir) else ()
  os.makedirs(config.workdir, exist_ok=True)
  if distributed.is_lead_process():
    with open(os.path.join(config.workdir, "config.json"), "w") as f:
      f.write(json.dumps(config.to_dict(), indent=2))
  optimizer = optimizer_of(config_lib.optimizer_config(config), setup.model_cfg)
  graphdef, params = initial_params(setup)
  graphdef, state, state_sh = create_train_state(setup.model_cfg, optimizer, setup.mesh,
                                                 config.seed, params=params,
                                                 with_reference=needs_reference(config))
  ckpt = Checkpointer(os.path.join(config.workdir, "checkpoints"), every=config.checkpoint.every,
                      keep=config.checkpoint.keep, settings=settings, allow_changed=allowed)
  return Run(graphdef, state, state_sh, optimizer, ckpt, found)


def resume(run: Run, data_iter) -> tuple[object, int]:
  """(state, step) from the work directory's newest checkpoint that restores (damaged newer ones
  are moved aside with a warning), restoring `data_iter` in place; the fresh state and step 0
  when there is none. Either is said in one line: `resumed from step K`, or, when the work
  directory held files but no checkpoint (a run stopped before it saved one), that the run
  starts over there."""
  state, start, _ = resume_with_extra(run, data_iter, None)
  return state, start


def resume_with_extra(run: Run, data_iter, abstract_extra) -> tuple[Any, int, Any]:
  """`resume`, and the checkpoint's `extra` item restored to `abstract_extra` (None when the
  checkpoint has none, or when there is no checkpoint)."""
  assert run.ckpt is not None   # `prepare_run` opens it
  start, state, extra = run.ckpt.restore_latest(abstract_like(run.state), data_iter,
                                                abstract_extra)
  if not start:
    if run.found and distributed.is_lead_process():
      workdir = os.path.dirname(run.ckpt.directory)
      shown = ", ".join(run.found[:4]) + (", ..." if len(run.found) > 4 else "")
      print(f"fresh start at step 0 in a non-empty work directory: {workdir} holds {shown} "
            "but no checkpoint to resume, so the run starts over and replaces them", flush=True)
    return run.state, 0, None
  if distributed.is_lead_process():
    print(f"resumed from step {start} ({run.ckpt.directory})", flush=True)
  return state, start, extra


def finish_run(setup: Setup, run: Run, state, step: int) -> str:
  """Waits for checkpoints and exports the final parameters to WORKDIR/params (its meta.json
  records the machine, `storage/machine.py`, which decides the last bits), and, for a model of a
  registered family, as a Hugging Face directory WORKDIR/hf with its official tensor names
  (process 0 writes; every process returns once the folders are complete)."""
  assert run.ckpt is not None   # `prepare_run` opens it
  run.ckpt.close()
  out = os.path.join(setup.config.workdir, weights_lib.RUN_PARAMS)
  params = sharding_lib.to_host(state.params)   # a collective: every process takes part
  if distributed.is_lead_process():
    hf_dir = weights_lib.hf_dir(setup.config)
    record = trained_run.run_record(setup.config, setup.tokenizer, hf_dir,
                                    export_model_type(setup.config, hf_dir))
    params_io.save_params(out, params, params_meta(setup, {"train_steps": int(step),
                                                       "seed": setup.config.seed,
                                                       "mode": setup.config.train.mode,
                                                       "machine": machine_lib.machine(),
                                                       trained_run.RUN_KEY: record}),
                          lambda folder: trained_run.save_tokenizer(setup.tokenizer, folder))
    if setup.model_cfg.hf_family:
      export_hf_dir(setup, params, os.path.join(setup.config.workdir, HF_EXPORT_DIR))
  distributed.barrier("export_params")
  return out


class RunLog:
  """The progress bar and the metrics file of a loop that runs steps (start, last]; `last` is
  `train.steps`, or `stop_after` when a test ends the run early (a simulated kill)."""

  def __init__(self, setup: Setup, start: int, desc: str, *, progress: bool = True,
               stop_after: int | None = None):
    tc = setup.config.train
    self.log_every = tc.log_every
    self.last = tc.steps if stop_after is None else min(tc.steps, stop_after)
    self.writer = MetricsWriter(setup.config.workdir, resume_step=start)
    self.bar = tqdm(total=tc.steps, initial=start, desc=desc, dynamic_ncols=True,
                    disable=not (progress and distributed.is_lead_process()))

  def due(self, step: int) -> bool:
    """Counts the step done; True when its metrics are to be written."""
    self.bar.update(1)
    return step % self.log_every == 0 or step == self.last

  def write(self, step: int, metrics: dict) -> dict:
    return self.writer.write(step, metrics)

  def close(self) -> None:
    self.bar.close()
    self.writer.close()
