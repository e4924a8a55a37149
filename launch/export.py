"""Export trained parameters as a Hugging Face model directory (config.json + safetensors with
the family's official tensor names; the residual adapter in a separate file) so existing
engines can serve the model. (Training runs of a registered family already write WORKDIR/hf.)

  python launch/export.py --config=configs/sdar.py:4b --config.model.path=/path/SDAR-4B-Chat \
      --params=work_dirs/sdar/params --out=work_dirs/sdar/hf
  python launch/export.py --config=configs/llada.py:debug --params=work_dirs/llada_debug/params \
      --out=work_dirs/llada_debug/hf

`model.path` (optional) is the Hugging Face directory the parameters were trained from: the
architecture, family and tokenizer.json come from it.
"""
import os

import _common  # repo on sys.path; run()
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax import params_io
from orl_jax import weights as weights_lib
from orl_jax.train.setup import build_setup, check_compatible, export_hf_dir
from orl_jax.train.state import init_model_params

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_PARAMS = flags.DEFINE_string("params", None, "params folder written by a training run")
_OUT = flags.DEFINE_string("out", None, "output Hugging Face model directory")
_SHARD = flags.DEFINE_integer("max_shard_bytes", 0, "split weights into shards of this size")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if not _PARAMS.value or not _OUT.value:
    raise app.UsageError("--params=DIR and --out=DIR are required")
  meta = params_io.read_meta(_PARAMS.value)
  with config.unlocked():
    config.model.init_from = ""
    if weights_lib.weights_of(config) is not None and not weights_lib.hf_dir(config):
      config.model.path = ""   # a params folder in model.path: --params names the weights
    config.model.residual.mode = meta.get("model", {}).get("residual_mode",
                                                           config.model.residual.mode)
  s = build_setup(config)
  _, params = init_model_params(s.model_cfg, config.seed)
  check_compatible(_PARAMS.value, s)
  params, _ = params_io.load_params(_PARAMS.value, params)
  out = export_hf_dir(s, params, _OUT.value, _SHARD.value)
  print(f"exported: {os.path.abspath(out)}")


if __name__ == "__main__":
  _common.run(main)
