"""Evaluate parameters on a task with several decoder settings; write results.json and a PNG.

  python launch/eval.py --config=configs/tiny.py:eval --config.model.init_from=assets/tiny_base
  python launch/eval.py --config=configs/tiny.py:eval --config.model.init_from=DIR \
      --config.eval.name=orl --config.eval.settings="('threshold_0.9','entropy_budget_0.5')"
"""
import os

import _common  # noqa: F401
from absl import app, logging
from ml_collections import config_flags

from orl_jax import demo, plots
from orl_jax import evaluate as eval_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if not config.model.init_from:
    raise app.UsageError("--config.model.init_from=DIR is required (a params folder, e.g. "
                         "assets/tiny_base or WORKDIR/params)")
  all_results = demo.evaluate_params(config, config.model.init_from, config.eval.name)
  png = plots.plot_frontier(all_results, os.path.join(config.workdir, "accuracy_vs_tpf.png"))
  print(eval_lib.format_table(all_results))
  print(f"plot: {png}")
  print(f"results: {os.path.abspath(demo.results_path(config))}")


if __name__ == "__main__":
  app.run(main)
