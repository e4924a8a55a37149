"""Evaluate models on a task with several decoder settings; write results.json, a table and a PNG.

  python launch/eval.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base
  python launch/eval.py --config=configs/tiny.py:eval --config.model.path=DIR \
      --config.eval.name=orl --config.eval.settings="('threshold_0.9','entropy_budget_0.5')"
  # a trained run's work directory (or its params/ folder): the model, tokenizer, special
  # tokens and chat template it was trained with come along; command-line overrides win
  python launch/eval.py --config=configs/llada.py:debug-jsonl \
      --config.model.path=work_dirs/llada_debug_jsonl
  # Base vs ORL side by side on GSM8K (HF directories or params folders; 'random' = fresh init):
  python launch/eval.py --config=configs/llada.py:8b-instruct --config.task.name=gsm8k \
      --config.eval.compare=/path/LLaDA-8B-Instruct:base,work_dirs/llada/params:orl
  python launch/eval.py --config=configs/llada.py:debug --config.task.name=gsm8k \
      --config.task.prompt_len=512 --config.eval.compare=random:base
  # DiffusionGemma: its own sampler; settings entropy_budget_<nats>; TPF also as tpf_*_decoder
  python launch/eval.py --config=configs/diffusion_gemma.py:debug --config.eval.compare=random:base
"""
import sys

import _common  # repo on sys.path; run()
from absl import app, logging
from ml_collections import config_flags

from orl_jax import distributed

from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax import evaluate as eval_lib
from orl_jax.apps import outputs
from orl_jax.apps.summary import write_report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)


def models_to_evaluate(config) -> list[tuple[str, str]]:
  """(weights, name) of each model: eval.compare's, else model.path's (named eval.name, or by
  what the weights are: a run's name, the folder's), else a fresh model with eval.random_init."""
  compare = config.eval.get("compare", "")
  if compare:
    return eval_lib.parse_compare(compare)
  weights = weights_lib.weights_of(config)
  if weights is not None:
    return [(weights.path, config.eval.name or weights_lib.display_name(weights.path))]
  if config.eval.get("random_init", False):
    return [(trained_run.RANDOM_INIT, config.eval.name or trained_run.RANDOM_INIT)]
  raise app.UsageError("give weights: --config.model.path=DIR (a Hugging Face model or a "
                       "params folder) or --config.eval.compare=DIR:name,DIR:name")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  distributed.maybe_initialize(config.get("distributed"))
  overridden = trained_run.overridden_fields(sys.argv)
  models = models_to_evaluate(config)
  notes = [outputs.use_trained_task(config, models, overridden)]
  folder, moved = outputs.evaluation_folder(outputs.eval_base(config, models, overridden),
                                            eval_lib.evaluation_setup(config))
  with config.unlocked():
    config.workdir = folder     # one folder per evaluation: never another run's
  if distributed.is_lead_process():
    for line in filter(None, notes + [moved]):
      print(line, flush=True)
  all_results = eval_lib.evaluate_models(config, models, overridden=overridden)
  table, png = write_report(all_results, config.workdir,
                            title=f"{config.task.name}: accuracy vs tokens per forward")
  print(eval_lib.format_table(all_results))
  print(f"table: {table}")
  print(f"plot: {png}")
  print(f"results: {config.workdir}/results.json")


if __name__ == "__main__":
  _common.run(main)
