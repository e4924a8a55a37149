"""Decode prompts with one or more models and show how each response was denoised.

  # your own prompt, with a Hugging Face directory (its config.json gives the family and every
  # shape), an orl_jax params folder or a run's work directory; no data file is needed
  python launch/decode.py --config=configs/llada.py:8b-instruct \
      --config.model.path=/path/LLaDA-8B-Instruct --prompt="What is 7 * 8?"
  python launch/decode.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base
  python launch/decode.py --config=configs/tiny.py:eval --models=base=assets/tiny_base,orl=DIR \
      --num=8 --html=work_dirs/trajectories.html

Prints each response with its forwards counted both ways (docs/decoding.md#two-forward-counts): the
paper's count (denoising forwards + one commit forward per decoded block; TPF uses it) and the
authors' count (denoising forwards only, what the model's official `generate` runs); writes an HTML
page where every token is coloured by the step at which it was committed (Base vs ORL side by side).
A DiffusionGemma directory decodes with its uniform-noise sampler (canvases of
`decode.block_size`, rule `entropy_budget_<nats>`); a token is coloured by the last step that
accepted it. Blocks sit where the model's authors put them (`decode.block_placement`): prompts
need no padding to a block boundary.
Without --prompt it decodes the first --num evaluation problems of `config.task`. The config
file gives the run-time choices (decoder rule, block size, lengths, dtypes, chat template).
"""
import copy
import sys

import _common  # repo on sys.path; run()
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax.config import derive as config_lib
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax.apps import outputs
from orl_jax.apps.trajectory_view import decode_model, write_page

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_MODELS = flags.DEFINE_string("models", "", "name=DIR,... (HF directories or params folders; "
                              "default: model.path)")
_NUM = flags.DEFINE_integer("num", 4, "number of evaluation problems to decode")
_PROMPT = flags.DEFINE_string("prompt", "", "decode this prompt instead of evaluation problems "
                              "(wrapped in task.chat; no task data needed; a model of the tiny "
                              "task, as the :debug configs train, reads only the tiny task's "
                              "words)")
_HTML = flags.DEFINE_string("html", "", "trajectory page path (default: WORKDIR/trajectories.html)")


def models_to_decode(config, models_flag: str) -> dict[str, str]:
  """name -> weights directory, from --models or model.path (model.init_from)."""
  models = dict(m.split("=", 1) if "=" in m else (weights_lib.display_name(m), m)
                for m in models_flag.split(",") if m)
  if not models:
    weights = weights_lib.weights_of(config)
    if weights is None:
      raise app.UsageError("give weights: --config.model.path=DIR (a Hugging Face model "
                           "directory, an orl_jax params folder or a finished run's work "
                           "directory) or --models=name=DIR,...")
    models = {weights_lib.display_name(weights.path): weights.path}
  for path in models.values():
    weights_lib.resolve(path, "--models" if models_flag else "model.path")
  return models


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if _PROMPT.present and not _PROMPT.value.strip():
    raise config_lib.ConfigError("--prompt is empty: give the text to decode, or leave --prompt "
                                 "out to decode the first --num evaluation problems of "
                                 "config.task")
  prompts = [_PROMPT.value] if _PROMPT.present else None
  overridden = trained_run.overridden_fields(sys.argv)
  models = [(path, name) for name, path in models_to_decode(config, _MODELS.value).items()]
  if prompts is None:   # the evaluation problems of the task one run was trained on
    note = outputs.use_trained_task(config, models, overridden)
    if note:
      print(note, flush=True)
  decoded = []
  for path, name in models:
    decoded.append(decode_model(copy.deepcopy(config), name, path, prompts, _NUM.value,
                                overridden))
    print("\n".join(decoded[-1].lines()), flush=True)
  page = write_page(_HTML.value or outputs.page_path(config, models, overridden), decoded)
  print(f"trajectories: {page}")


if __name__ == "__main__":
  _common.run(main)
