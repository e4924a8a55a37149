"""Train (and, for the demo variant, evaluate) from a config file.

  python launch/train.py --config=configs/tiny.py                 # the embedded demo
  python launch/train.py --config=configs/tiny.py:sft --config.train.steps=2000
"""
import _common  # noqa: F401  (repo on sys.path)
from absl import app, logging
from ml_collections import config_flags

from orl_jax import demo
from orl_jax.train import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if config.get("pipeline", "train") == "demo":
    demo.run_demo(config)
  else:
    out = loop.train(config)
    print(f"parameters: {out}")


if __name__ == "__main__":
  app.run(main)
