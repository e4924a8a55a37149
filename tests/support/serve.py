"""What the server tests share: the README's command, the tiny task's prompts, and the offline
reference (the per-row engine decoding one prompt alone with a request's key)."""
import dataclasses
import functools

import jax
import numpy as np

from configs import tiny
from orl_jax.data.pipeline import encode_prompt
from orl_jax.decode import per_row
from orl_jax.problem import Problem
from orl_jax.config.build import build
from orl_jax.serve.load import engine_parts
from orl_jax.tasks import get_task
from orl_jax.unmasking import UnmaskRule

# the README's command (docs/serving.md); the tests add --port=0 (orl_jax.serve.process)
README_SERVE = ["--config=configs/tiny.py:eval", "--config.model.path=assets/tiny_base"]
MODEL = "tiny_base"


@functools.lru_cache(maxsize=None)
def tiny_problems(n: int = 64) -> tuple:
  config = tiny.get_config("eval")
  return tuple(get_task(build(config).task).eval_problems()[:n])


@functools.lru_cache(maxsize=None)
def offline(path: str = "assets/tiny_base", rows: int = 16):
  """The served model's engine parts in this process (`serve.load.engine_parts`)."""
  config = tiny.get_config("eval")
  config.model.path = path
  config.serve.rows = rows
  return engine_parts(config)


@functools.lru_cache(maxsize=None)
def _engine(parts, rule: UnmaskRule, temperature: float, gen_length: int):
  cfg = dataclasses.replace(parts.cfg, rule=rule, temperature=temperature, gen_length=gen_length)
  return per_row.make_engine(parts.graphdef, cfg, parts.shape.rows)


def alone(parts, prompt: str, *, seed: int = 0, choice: int = 0, decoder: str = "",
          temperature: float = 0.0, max_tokens: int = 0) -> tuple[str, int, int]:
  """(text, forwards, denoising forwards) of the offline per-row engine decoding `prompt` alone
  with the key the server gives choice `choice` of a request with `seed`."""
  tok, b = parts.setup.tokenizer, parts.cfg.block_size
  n = max_tokens or parts.cfg.gen_length
  rule = UnmaskRule.parse(decoder) if decoder else parts.cfg.rule
  tokens, valid = encode_prompt(Problem("q", prompt), tok, parts.shape.prompt_len)
  key = per_row.request_keys(np.array([seed % 2**32], np.uint32),
                             np.array([seed // 2**32], np.uint32), np.array([choice], np.int32))
  run = _engine(parts, rule, temperature, -(-n // b) * b)
  out = jax.device_get(run(parts.params, tokens[None], valid[None], key))
  text = tok.decode(np.asarray(out.tokens[0])[:n], stop_at_eos=True)
  return text, int(out.nfe[0]), int(out.nfe_denoise[0])
