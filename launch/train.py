"""Train (and, for the demo variant, evaluate) from a config file.

  python launch/train.py --config=configs/tiny.py                 # the embedded demo
  python launch/train.py --config=configs/tiny.py:sft --config.train.steps=2000
  python launch/train.py --config=configs/llada.py:debug          # tiny random LLaDA, 2 ORL steps
  python launch/train.py --config=configs/llada.py:8b-instruct --config.dry_run=True \
      --config.mesh.fsdp=8                                        # per-device sizing, no allocation
"""
import sys

import _common  # repo on sys.path; run()

_common.stop_on_signals()   # first: Ctrl-C while JAX imports ends in one line too

from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from orl_jax import distributed  # noqa: E402

from orl_jax.storage import trained_run  # noqa: E402
from orl_jax.apps import outputs  # noqa: E402
from orl_jax.apps import demo  # noqa: E402
from orl_jax.apps.summary import report_run  # noqa: E402
from orl_jax.train.entry import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  workdir = outputs.train_workdir(config, trained_run.overridden_fields(sys.argv))
  if workdir != config.workdir:   # the task file's own run, not the variant's example run
    with config.unlocked():
      config.workdir = workdir
  distributed.maybe_initialize(config.get("distributed"))
  if config.get("dry_run", False):
    from orl_jax.apps import dry_run
    rows, info = dry_run.sizing_rows(config)
    print(dry_run.format_table(rows, info))
  elif config.get("pipeline", "train") == "demo":
    demo.run_demo(config)
  else:
    out = train(config)
    if distributed.is_lead_process():
      print("\n".join(report_run(config, out)))


if __name__ == "__main__":
  _common.run(main)
