"""The training entry point `train(config)`: the run's `train.mode` picks its loop from `LOOPS`.

Where things live: `orl_jax/setup/` (a run's set-up, shared with evaluation and serving),
`run.py` (a training run's life: prepare, resume, finish; shared by every loop), `sft.py` (SFT,
the residual warm-up and offline RCD), `orl.py` (the on-policy loop), `state.py` (train state,
the jitted step).
"""
from __future__ import annotations

from orl_jax import sharding
from orl_jax.config import build as run_config
from orl_jax.config.derive import TRAIN_MODES
from orl_jax.train import orl, sft
from orl_jax.setup.build import build_setup
from orl_jax.storage.weights import require_weights

# train.mode -> the loop that runs it: `loop(setup, progress=, stop_after=)`
LOOPS = {"sft": sft.train_sft, "residual_warmup": sft.train_sft,
         "rcd_offline": sft.train_sft, "orl": orl.train_orl}


def train(config, *, progress: bool = True, stop_after: int | None = None) -> str:
  """Runs `config.train.mode` to `train.steps`, resuming from the work directory's latest
  checkpoint. Returns the folder of the exported final parameters.

  `stop_after` ends the run early after that many steps (tests use it to simulate a kill).
  """
  config = run_config.build(config)
  require_weights(config)
  setup = build_setup(config)
  loop = LOOPS.get(config.train.mode)
  if loop is None:
    raise ValueError(f"train() runs train.mode {' | '.join(TRAIN_MODES)}, got "
                     f"{config.train.mode!r} (an 'eval' config evaluates: python launch/eval.py)")
  with sharding.tracing_mesh(setup.mesh):
    return loop(setup, progress=progress, stop_after=stop_after)
