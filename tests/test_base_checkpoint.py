"""The committed tiny base model (assets/tiny_base, made by `make base`) loads and is accurate."""
import os

from configs import tiny
from orl_jax import evaluate as eval_lib
from orl_jax import params_io
from orl_jax.train import loop
from orl_jax.unmasking import UnmaskRule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "assets", "tiny_base")


def test_committed_base_model_is_accurate():
  assert os.path.exists(os.path.join(BASE, "params.safetensors")), "run `make base`"
  meta = params_io.read_meta(BASE)
  config = tiny.get_config("eval")
  config.model.init_from = BASE
  s = loop.setup(config)
  assert meta["vocab_hash"] == s.tokenizer.vocab_hash()
  graphdef, params = loop.initial_params(s)
  problems = s.task.eval_problems()[:64]
  r = eval_lib.evaluate_setting(graphdef, params, problems, s.task, config,
                                UnmaskRule("fixed_steps", 1), batch_size=64)
  assert r["accuracy"] >= 0.85, r["accuracy"]
  assert r["nfe_mean"] == 32  # one token per forward over a 32-token block


def test_base_model_provenance_is_recorded():
  with open(os.path.join(BASE, "README.md")) as f:
    text = f.read()
  assert "make base" in text and "seed" in text
