"""Export trained parameters as a Hugging Face model directory (config.json + safetensors with
the family's official tensor names, the residual adapter in adapter.safetensors, the tokenizer
files and, for the families transformers does not ship, the `auto_map` of the authors' code) so
other tools can load the model. Training runs of a registered family already write WORKDIR/hf.

  python launch/export.py --config=configs/sdar.py:4b --params=work_dirs/sdar_4b_my_train \
      --out=work_dirs/sdar_4b_my_train/hf_export
  python launch/export.py --config=configs/llada.py:debug --params=work_dirs/llada_debug \
      --out=work_dirs/llada_debug/hf_export --max_shard_bytes=200000

`--params` is a finished run's work directory or its `params/` folder: the model, tokenizer,
special tokens and chat template it was trained with come from there (command-line overrides
win), so no task is needed. `model.path` (optional) is the Hugging Face directory the run
started from (default: the one the run recorded, when it is still there): its modeling code
(`*.py`), generation_config.json and other tokenizer files are copied into the export.
"""
import os
import sys

import _common  # repo on sys.path; run()
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax.models import params_io

from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax.errors import ConfigError
from orl_jax.setup.build import build_setup, check_compatible
from orl_jax.storage.hf_export import export_hf_dir
from orl_jax.models.build import init_model_params

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_PARAMS = flags.DEFINE_string("params", None, "a finished run's work directory or its params/ "
                              "folder")
_OUT = flags.DEFINE_string("out", None, "output Hugging Face model directory")
_SHARD = flags.DEFINE_integer("max_shard_bytes", 0, "split weights into shards of this size")


def export_config(config, params_arg: str, overridden: frozenset) -> str:
  """Sets `config` up to export the run at `params_arg` (its trained settings, the source
  directory as model.path); returns the params folder."""
  kind, params_dir = weights_lib.resolve(params_arg, "--params")
  if kind != weights_lib.PARAMS:
    raise ConfigError(f"--params={params_arg!r} is a Hugging Face model directory, not trained "
                      "parameters: give a finished run's work directory or its params/ folder")
  trained_run.apply_settings(config, trained_run.trained_settings(kind, params_dir), overridden)
  source = weights_lib.hf_dir(config)        # the user's model.path, when it is one
  if not source:
    recorded = params_io.read_meta(params_dir).get(trained_run.RUN_KEY, {}).get("source", "")
    source = recorded if recorded and os.path.isdir(recorded) else ""
    if recorded and not source:
      logging.warning("%s, the directory the run started from, is gone: the export carries no "
                      "modeling code or generation_config.json from it", recorded)
  with config.unlocked():
    config.model.init_from = ""
    config.model.path = source
  return params_dir


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if not _PARAMS.value or not _OUT.value:
    raise app.UsageError("--params=DIR and --out=DIR are required")
  params_dir = export_config(config, _PARAMS.value, trained_run.overridden_fields(sys.argv))
  s = build_setup(config, prompts=())        # an export needs the tokenizer, not the task data
  _, params = init_model_params(s.model_cfg, config.seed)
  check_compatible(params_dir, s)
  params, _ = params_io.load_params(params_dir, params)
  out = export_hf_dir(s, params, _OUT.value, _SHARD.value)
  print(f"exported: {os.path.abspath(out)}")


if __name__ == "__main__":
  _common.run(main)
