"""Decode prompts with one or more models and show how each response was denoised.

  # your own prompt, with a Hugging Face directory (its config.json gives the family and every
  # shape), an orl_jax params folder or a run's work directory; no data file is needed
  python launch/decode.py --config=configs/llada.py:8b-instruct \
      --config.model.path=/path/LLaDA-8B-Instruct --prompt="What is 7 * 8?"
  python launch/decode.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base
  python launch/decode.py --config=configs/tiny.py:eval --models=base=assets/tiny_base,orl=DIR \
      --num=8 --html=work_dirs/trajectories.html

Prints each response with its forwards counted both ways (DESIGN §2.2): the paper's count
(denoising forwards + one commit forward per decoded block; TPF uses it) and the authors' count
(denoising forwards only, what the model's official `generate` runs); writes an HTML page where
every token is coloured by the step at which it was committed (Base vs ORL side by side).
A DiffusionGemma directory decodes with its uniform-noise sampler (canvases of
`decode.block_size`, rule `entropy_budget_<nats>`); a token is coloured by the last step that
accepted it. Blocks sit where the model's authors put them (`decode.block_placement`): prompts
need no padding to a block boundary.
Without --prompt it decodes the first --num evaluation problems of `config.task`. The config
file gives the run-time choices (decoder rule, block size, lengths, dtypes, chat template).
"""
import copy
import dataclasses
import math
import os
import sys
from typing import Sequence

import _common  # repo on sys.path; run()
import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax import config as config_lib
from orl_jax.decode import build as decode_build
from orl_jax import sharding
from orl_jax import trained_run
from orl_jax import weights as weights_lib
from orl_jax.apps import trajectory_view
from orl_jax.data.pipeline import encode_prompts
from orl_jax.train.setup import build_setup, initial_params
from orl_jax.unmasking import UnmaskRule

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


@dataclasses.dataclass
class Decoded:
  """One model's responses to the same problems."""
  name: str
  path: str
  rule_label: str
  prompts: list[str]          # the model input text of each problem (chat template applied)
  texts: list[str]            # responses, through the first EOS
  tokens: np.ndarray          # [n, gen_length] response tokens
  steps: np.ndarray           # [n, gen_length] step at which each token was committed
  nfe: np.ndarray             # [n] forwards, one commit forward per decoded block included
  nfe_denoise: np.ndarray     # [n] denoising forwards only (the authors' count)
  n_generated: np.ndarray     # [n] tokens through the first EOS
  scores: list[float]         # verifier scores (NaN: a prompt without an answer)
  tokenizer: object

  def lines(self) -> list[str]:
    """What the launcher prints for this model."""
    out = [f"== {self.name} ({self.path}), decoder {self.rule_label}; forwards: paper's count "
           "(denoising + 1 commit per block; TPF) / authors' count (denoising only)"]
    if hasattr(self.tokenizer, "origins_text"):
      out.append(f"  special tokens: {self.tokenizer.origins_text()}")
    for prompt, text, nfe, denoise, n, score in zip(self.prompts, self.texts, self.nfe,
                                                    self.nfe_denoise, self.n_generated,
                                                    self.scores):
      tail = "" if math.isnan(score) else f", score {score:.0f}"
      out.append(f"  {prompt}\n    -> {text}   [NFE paper {int(nfe)} / denoising "
                 f"{int(denoise)}, TPF {n / max(nfe, 1):.2f} / {n / max(denoise, 1):.2f}{tail}]")
    return out


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


def _encode(problems, tokenizer, prompt_len: int):
  try:
    return encode_prompts(problems, tokenizer, prompt_len)
  except ValueError as e:    # a prompt longer than task.prompt_len: one line, no traceback
    raise config_lib.ConfigError(str(e)) from None


def decode_model(config, name: str, path: str, prompts: Sequence[str] | None = None,
                 num: int = 4, overridden: frozenset = frozenset()) -> Decoded:
  """Decodes `prompts` (or the first `num` evaluation problems of `config.task`) with the
  weights at `path`, as `config` sets the decoder. A Hugging Face directory gives the family and
  every shape (its config.json); a params folder (or a run's work directory) gives what it was
  trained with (`trained_run`), except the fields in `overridden`."""
  s = build_setup(trained_run.model_config_for(config, path, overridden), prompts=prompts)
  cfg = s.config
  problems = s.task.eval_problems() if prompts else s.task.eval_problems()[:num]
  tok = s.tokenizer
  tokens, valid = _encode(problems, tok, cfg.task.prompt_len)
  rule = UnmaskRule(cfg.decode.rule, cfg.decode.rule_value)
  graphdef, params = initial_params(s)
  ids = dict(mask_id=tok.mask_id, eos_id=tok.eos_id)
  run = decode_build.make_decoder(cfg, s.model_cfg, graphdef, "decode", rule=rule, **ids)
  with sharding.tracing_mesh(s.mesh):
    out = jax.device_get(run(params, tokens, valid, jax.random.key(0)))
  texts = [tok.decode(t, stop_at_eos=True) for t in out.tokens]
  lead = decode_build.sampler_of(cfg, s.model_cfg).prompt_lead(valid, **ids)
  return Decoded(
      name=name, path=path, rule_label=rule.label, prompts=[p.prompt for p in problems],
      texts=texts, tokens=np.asarray(out.tokens),
      steps=trajectory_view.commit_steps(out.capture, len(problems), cfg.decode.block_size,
                                         cfg.decode.gen_length, np.asarray(lead)),
      nfe=np.asarray(out.nfe), nfe_denoise=np.asarray(out.nfe_denoise),
      n_generated=np.asarray(out.n_generated),
      scores=list(s.task.verifier.score_batch(problems, texts)), tokenizer=tok)


def write_page(path: str, decoded: list[Decoded]) -> str:
  """The trajectory page of every model (coloured by commit step), side by side."""
  first = decoded[0]
  columns = {d.name: (d.tokens, d.steps, d.nfe, d.nfe_denoise) for d in decoded}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(trajectory_view.render(first.prompts, columns, first.tokenizer,
                                   first.tokenizer.eos_id))
  return os.path.abspath(path)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if _PROMPT.present and not _PROMPT.value.strip():
    raise config_lib.ConfigError("--prompt is empty: give the text to decode, or leave --prompt "
                                 "out to decode the first --num evaluation problems of "
                                 "config.task")
  prompts = [_PROMPT.value] if _PROMPT.present else None
  decoded = []
  for name, path in models_to_decode(config, _MODELS.value).items():
    decoded.append(decode_model(copy.deepcopy(config), name, path, prompts, _NUM.value,
                                trained_run.overridden_fields(sys.argv)))
    print("\n".join(decoded[-1].lines()), flush=True)
  page = write_page(_HTML.value or os.path.join(config.workdir, "trajectories.html"), decoded)
  print(f"trajectories: {page}")


if __name__ == "__main__":
  _common.run(main)
