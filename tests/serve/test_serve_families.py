"""Every family the project decodes serves (`serve.load.engine_parts` -> engine -> scheduler),
on the `:debug` configs' tiny random models: LLaDA2.x (MoE, blocks at absolute positions,
every block decoded; with LLaDA2.1's token editing), SDAR and QwenDLM (Qwen3 block DLMs), and
DiffusionGemma (its own uniform-noise sampler, a request decoded whole). Each response, with
its own seed, equals the offline decoder on its prompt alone with the request's key, forward
counts included."""
import threading

import jax
import numpy as np
import pytest

from configs import diffusion_gemma, llada, qwendlm, sdar
from orl_jax.storage import trained_run
from orl_jax.data.pipeline import encode_prompt
from orl_jax.decode import build as decode_build
from orl_jax.decode import per_row
from orl_jax.problem import Problem
from orl_jax.serve.load import engine_parts, warm
from orl_jax.serve.scheduler import Event, Request, Scheduler
from tests.support.serve import tiny_problems

# compares token ids and forward counts: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics


def _llada21_editing():
  return llada.preset(llada.get_config("debug"), "dllm")


CONFIGS = {"llada2": lambda: llada.get_config("debug"), "llada2.1-editing": _llada21_editing,
           "sdar": lambda: sdar.get_config("debug"), "qwendlm": lambda: qwendlm.get_config("debug"),
           "diffusion_gemma": lambda: diffusion_gemma.get_config("debug")}


def _serve(parts, prompts, seeds):
  """{i: done event} of each prompt served with seed seeds[i] (4 rows, all at once), by an
  engine warmed as the server warms it (`load.warm`: it must change nothing)."""
  tok = parts.setup.tokenizer
  engine = parts.engine()
  warm(engine, parts.rule, tok.eos_id)
  scheduler = Scheduler(engine, tok, max_waiting=64)
  scheduler.start()
  done: dict[int, Event] = {}
  finished = threading.Event()

  def emit(i):
    def on(event):
      if event.kind == "done":
        done[i] = event
        if len(done) == len(prompts):
          finished.set()
    return on
  try:
    for i, (text, seed) in enumerate(zip(prompts, seeds)):
      scheduler.submit(Request(tok.encode(text), scheduler.engine.cfg.gen_length, parts.rule,
                               parts.setup.config.decode.temperature, seed, emit(i),
                               stream=False))
    assert finished.wait(600), done
  finally:
    scheduler.stop(timeout=60)
  return done


def _offline(parts):
  """The family's offline decoder: `(params, tokens [1, P], valid, key [1]) -> DecodeOutput`
  (the per-row engine on one prompt, or the family's own decoder on a batch of one)."""
  s, tok = parts.setup, parts.setup.tokenizer
  if parts.cfg is not None:
    return per_row.make_engine(parts.graphdef, parts.cfg, parts.shape.rows)
  run = decode_build.sampler_of(s.config, s.model_cfg).decoder(
      parts.graphdef, "evaluate", mask_id=tok.mask_id, eos_id=tok.eos_id, rule=parts.rule)
  return lambda params, tokens, valid, key: run(params, tokens, valid, key[0])


def _alone(parts, run, text: str, seed: int):
  """(text, forwards, denoising forwards) of the offline decoder `run` on the prompt alone,
  with the key the server gives choice 0 of a request with `seed`."""
  tok = parts.setup.tokenizer
  tokens, valid = encode_prompt(Problem("q", text), tok, parts.shape.prompt_len)
  key = per_row.request_keys(np.array([seed % 2**32], np.uint32),
                             np.array([seed // 2**32], np.uint32), np.array([0], np.int32))
  out = jax.device_get(run(parts.params, tokens[None], valid[None], key))
  return tok.decode(np.asarray(out.tokens[0]), stop_at_eos=True), int(out.nfe[0]), int(
      out.nfe_denoise[0])


@pytest.mark.parametrize("name", CONFIGS)
def test_each_family_serves_what_its_offline_decoder_decodes_alone(name):
  config = CONFIGS[name]()
  config.serve.rows = 4
  parts = engine_parts(config, trained_run.RANDOM_INIT)
  prompts = [p.prompt for p in tiny_problems()[:6]]
  seeds = [3, 2**35 + 1, 7, 11, 0, 5]
  done = _serve(parts, prompts, seeds)
  run = _offline(parts)
  for i, (text, seed) in enumerate(zip(prompts, seeds)):
    want = _alone(parts, run, text, seed)
    got = (done[i].text, done[i].usage["forwards"], done[i].usage["forwards_denoise"])
    assert got == want, (name, i)
