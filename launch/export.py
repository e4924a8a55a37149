"""Export trained parameters as a Hugging Face model directory (config.json + safetensors; the
residual adapter in a separate file) so existing engines can serve the model.

  python launch/export.py --config=configs/sdar.py:4b --config.model.hf_dir=/path/SDAR-4B-Chat \
      --params=work_dirs/sdar/params --out=work_dirs/sdar/hf
"""
import os

import _common  # repo on sys.path; run()
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax import params_io
from orl_jax.models import hf
from orl_jax.train import loop

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
    config.model.init_from = _PARAMS.value
    config.model.residual.mode = meta.get("model", {}).get("residual_mode",
                                                           config.model.residual.mode)
  s = loop.setup(config)
  _, params = loop.initial_params(s)
  family = loop.hf_family(config)
  tok_file = None
  if config.model.get("hf_dir"):
    candidate = os.path.join(config.model.hf_dir, "tokenizer.json")
    tok_file = candidate if os.path.exists(candidate) else None
  out = hf.export_hf(_OUT.value, params, s.model_cfg, family, tokenizer_file=tok_file,
                     max_shard_bytes=_SHARD.value)
  print(f"exported: {os.path.abspath(out)}")


if __name__ == "__main__":
  _common.run(main)
