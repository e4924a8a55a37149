"""Decode a few prompts with one or more models and show how each response was denoised.

  python launch/decode.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base
  python launch/decode.py --config=configs/tiny.py:eval --models=base=assets/tiny_base,orl=DIR \
      --num=8 --html=work_dirs/trajectories.html

Prints each response with its forwards (NFE) and tokens per forward; writes an HTML page where
every token is coloured by the step at which it was committed (Base vs ORL side by side).
"""
import copy
import os

import _common  # repo on sys.path; run()
import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax import config as config_lib
from orl_jax import trajectory_view
from orl_jax.data.pipeline import encode_prompts
from orl_jax.decoding import make_decoder
from orl_jax import weights as weights_lib
from orl_jax.train import loop
from orl_jax.unmasking import UnmaskRule

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_MODELS = flags.DEFINE_string("models", "", "name=params_dir,... (default: model.path)")
_NUM = flags.DEFINE_integer("num", 4, "number of evaluation problems to decode")
_PROMPT = flags.DEFINE_string("prompt", "", "decode this prompt instead of evaluation problems")
_HTML = flags.DEFINE_string("html", "", "trajectory page path (default: WORKDIR/trajectories.html)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  models = dict(m.split("=", 1) for m in _MODELS.value.split(",") if m)
  if not models:
    weights = weights_lib.weights_of(config)
    if weights is None:
      raise app.UsageError("give --models=name=DIR,... or --config.model.path=DIR")
    models = {"model": weights.path}
  s = loop.setup(config)
  tok = s.tokenizer
  if _PROMPT.value:
    from orl_jax.problem import Problem
    problems = [Problem("user-0", _PROMPT.value)]
  else:
    problems = s.task.eval_problems()[:_NUM.value]
  prompts, valid = encode_prompts(problems, tok, config.task.prompt_len)
  rule = UnmaskRule(config.decode.rule, config.decode.rule_value)
  dcfg = config_lib.decode_config(config, mask_id=tok.mask_id, eos_id=tok.eos_id, rule=rule,
                                  capture_states=0)
  import dataclasses
  dcfg = dataclasses.replace(dcfg, capture_states=dcfg.n_blocks * dcfg.steps_bound)
  columns = {}
  for name, params_dir in models.items():
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
      cfg.model.init_from, cfg.model.path = "", params_dir
      from orl_jax import params_io
      mode = params_io.read_meta(params_dir).get("model", {}).get("residual_mode")
      if mode:
        cfg.model.residual.mode = mode
    ms = loop.setup(cfg)
    graphdef, params = loop.initial_params(ms)
    out = jax.device_get(make_decoder(graphdef, dcfg)(params, prompts, valid, jax.random.key(0)))
    steps = trajectory_view.commit_steps(out.capture, len(problems), dcfg.block_size,
                                         dcfg.gen_length)
    columns[name] = (np.asarray(out.tokens), steps, np.asarray(out.nfe))
    print(f"== {name} ({params_dir}), decoder {rule.label}")
    for p, t, nfe, n in zip(problems, out.tokens, out.nfe, out.n_generated):
      text = tok.decode(t, stop_at_eos=True)
      score = s.task.verifier.score_batch([p], [text])[0] if p.answer else float("nan")
      print(f"  {p.prompt}\n    -> {text}   [NFE {int(nfe)}, TPF {n / max(nfe, 1):.2f}, "
            f"score {score:.0f}]")
  path = _HTML.value or os.path.join(config.workdir, "trajectories.html")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(trajectory_view.render([p.prompt for p in problems], columns, tok, tok.eos_id))
  print(f"trajectories: {os.path.abspath(path)}")


if __name__ == "__main__":
  _common.run(main)
