"""Evaluation of DiffusionGemma (docs/method.md#metrics): `evaluate_models` decodes with the
family's own uniform-noise sampler (`decode_build.make_decoder`) and reports TPF in both conventions
— over the denoising forwards only, the authors' (transformers') count `_denoise`, and with one
commit forward per decoded canvas, the paper's count (docs/decoding.md#two-forward-counts). The
forwards are counted here by hand from the sampler's own output for the same prompts and key:
denoising forwards are the steps its trace marks as counted, decoded canvases run up to the canvas
holding the row's first EOS, the batch generates canvases until its last row has finished, and
generated tokens are the non-padding ones (transformers' `tokens_per_forward` numerator)."""
import json
import os

import jax
import numpy as np
import pytest

from configs import diffusion_gemma as dg_configs
from orl_jax.config import build as run_config
from orl_jax.models.diffusion_gemma import sampler
from orl_jax import evaluate as eval_lib
from orl_jax.storage import trained_run
from orl_jax.data.pipeline import encode_prompts
from orl_jax.models import families
from orl_jax.setup.build import build_setup, initial_params
from orl_jax.unmasking import UnmaskRule

# compares token ids, forward counts or signs: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics

SETTING = "entropy_budget_0.1"


def _config(workdir):
  c = dg_configs.get_config("debug")
  c.workdir = str(workdir)
  c.eval.n_problems, c.eval.batch_size = 16, 16
  c.eval.settings = (SETTING,)
  return c


def _hand_count(c):
  """Per-row (generated tokens, decoder forwards, decoded canvases) of the sampler run the
  evaluation makes (model 'random' = init from config.seed; batch 0 uses fold_in(key(0), 0))."""
  s = build_setup(trained_run.model_config_for(c, trained_run.RANDOM_INIT))
  graphdef, params = initial_params(s)
  problems = s.task.eval_problems()[:c.eval.n_problems]
  prompts, valid = encode_prompts(problems, s.task.tokenizer, c.task.prompt_len)
  scfg = sampler.sampler_config(s.config, eos_ids=s.model_cfg.eos_ids, pad_id=s.model_cfg.pad_id,
                                   rollout=False, entropy_bound=UnmaskRule.parse(SETTING).value)
  out = sampler.make_generator(graphdef, scfg)(params, prompts,
                                               jax.random.fold_in(jax.random.key(0), 0), valid)
  tokens = np.asarray(out.tokens)
  n_canvases, canvas = scfg.n_canvases, s.model_cfg.canvas_length
  is_eos = np.isin(tokens, s.model_cfg.eos_ids)
  first = np.argmax(is_eos, axis=1)
  has = is_eos.any(axis=1)
  n_gen = (tokens != s.model_cfg.pad_id).sum(axis=1)
  assert (n_gen <= np.where(has, first + 1, n_canvases * canvas)).all()   # padding after EOS
  canvases = np.where(has, first // canvas + 1, n_canvases)
  assert int(out.canvases_run) == canvases.max()      # no canvas after the last row finished
  decoder = np.asarray(out.trace.counted).sum(axis=(0, 1))
  return n_gen, decoder, canvases, int(out.canvases_run)


def test_evaluation_reports_tpf_in_both_conventions_as_counted_by_hand(tmp_path):
  c = _config(tmp_path)
  all_results = eval_lib.evaluate_models(c, [(trained_run.RANDOM_INIT, "base")], progress=False)
  with open(os.path.join(c.workdir, "results.json")) as f:
    assert json.load(f) == json.loads(json.dumps(all_results))
  r = all_results["base"][SETTING]
  n_gen, decoder, canvases, canvases_run = _hand_count(c)
  paper = decoder + canvases                 # + one commit forward per decoded canvas
  engine = decoder + canvases_run - 1        # the commits the sampler ran (none after the last)
  print(f"rows decoding 1 canvas: {(canvases == 1).sum()} of {len(canvases)}; canvases run "
        f"{canvases_run}; tpf {r['tpf_pooled']:.3f}, denoise-only {r['tpf_pooled_denoise']:.3f}")
  close = lambda a, b: abs(a - b) <= 1e-9 * abs(b)
  assert close(r["tpf_pooled"], n_gen.sum() / paper.sum())
  assert close(r["tpf_pooled_denoise"], n_gen.sum() / decoder.sum())
  assert close(r["tpf_pooled_engine"], n_gen.sum() / engine.sum())
  assert close(r["tpf_mean"], np.mean(n_gen / paper))
  assert close(r["tpf_mean_denoise"], np.mean(n_gen / decoder))
  assert close(r["nfe_mean"], paper.mean()) and close(r["nfe_mean_denoise"], decoder.mean())
  assert close(r["tokens_mean"], n_gen.mean())
  # the two conventions differ by exactly the commit forwards: 1/TPF grows by canvases/tokens
  assert close(1 / r["tpf_pooled"] - 1 / r["tpf_pooled_denoise"], canvases.sum() / n_gen.sum())
  assert r["tpf_pooled_denoise"] > r["tpf_pooled"] > 0 and 0 <= r["accuracy"] <= 1


def test_evaluation_names_a_setting_the_sampler_cannot_decode():
  from orl_jax.decode import build as decode_build
  c = dg_configs.get_config("debug")
  run = run_config.convert(c)
  model_cfg = families.get("diffusion_gemma").config_from_run(
      run.model, block_size=run.decode.block_size, vocab_size=64)
  with pytest.raises(ValueError, match="eval.settings: 'threshold_0.9'.*entropy_budget_<nats>"):
    decode_build.make_decoder(c, model_cfg, None, "evaluate", mask_id=0, eos_id=1,
                          rule=UnmaskRule("threshold", 0.9))
