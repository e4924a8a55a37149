"""A served model from a run config and its weights: what `launch/serve.py` builds.

The weights may be a Hugging Face directory, a finished run's work directory or its `params/`
folder (`orl_jax.storage.weights`), as for decoding and evaluation: a trained run brings its
tokenizer, special tokens and chat template (`trained_run`), the config file the run-time
choices (decoder rule, block size, lengths). The engine is the per-row block decoder
(`engine.BlockEngine`) for every mask-diffusion family; the prompt length is `task.prompt_len`,
the generation length `decode.gen_length`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

import jax
import numpy as np

from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib
from orl_jax.errors import ConfigError
from orl_jax.decode import build as decode_build
from orl_jax.decode.config import DecodeConfig
from orl_jax.serve.app import Served
from orl_jax.serve.engine import BlockEngine, EngineShape, Entry, WholeEngine
from orl_jax.serve.metrics import ServerMetrics
from orl_jax.serve import weights_watch
from orl_jax.serve.scheduler import Scheduler
from orl_jax.setup.build import Setup, build_setup, initial_params
from orl_jax.unmasking import RULES, UnmaskRule


def _setup(config, path: str, overridden: frozenset):
  return build_setup(trained_run.model_config_for(config, path, overridden), prompts=[])


def _same_tree(new, old, path: str) -> None:
  """ValueError naming `path` unless `new` has `old`'s tree, shapes and dtypes."""
  shapes = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)
  try:
    same = shapes(new) == shapes(old)
  except ValueError:
    same = False
  if not same:
    raise ValueError(f"{path} holds another model's parameters (other tensors or shapes) than "
                     "the one served; a reload takes weights of the same model")


@dataclasses.dataclass(eq=False)
class EngineParts:
  """What a served model's engine is built from (also what a benchmark or a test decodes
  offline with, to compare)."""
  setup: Setup
  graphdef: object
  params: object
  cfg: DecodeConfig | None     # the block decoder's config ("evaluate"), the defaults; None: a
                               # family sampler that decodes a request whole (`WholeEngine`)
  shape: EngineShape
  path: str

  @property
  def rule(self) -> UnmaskRule:
    d = self.setup.config.decode
    return UnmaskRule(d.rule, float(d.rule_value or 0))

  def engine(self):
    """The engine: the per-row block engine, or a family sampler's whole-request engine."""
    s, tok = self.setup, self.setup.tokenizer
    if self.cfg is not None:
      return BlockEngine(self.graphdef, self.params, s.model_cfg, self.cfg, self.shape, s.mesh)
    sampler = decode_build.sampler_of(s.config, s.model_cfg)
    decoder = sampler.decoder(self.graphdef, "evaluate", mask_id=tok.mask_id,
                              eos_id=tok.eos_id, rule=self.rule)
    return WholeEngine(decoder, self.params, s.model_cfg, self.shape, s.mesh,
                       block_size=s.config.decode.block_size, eos_id=tok.eos_id)


def engine_parts(config, path: str = "", overridden: frozenset = frozenset()) -> EngineParts:
  """The weights at `path` (default `model.path` / `model.init_from`) and the engine `config`
  serves them with."""
  if not path:
    weights = weights_lib.weights_of(config)
    if weights is None:
      raise ConfigError("give weights: --config.model.path=DIR (a Hugging Face directory, an "
                        "orl_jax params folder or a finished run's work directory)")
    path = weights.path
  if path != trained_run.RANDOM_INIT:    # "random": a fresh model from config.seed (tests)
    weights_lib.resolve(path)
  s = _setup(config, path, overridden)
  run, tok = s.config, s.tokenizer
  graphdef, params = initial_params(s)
  sampler = decode_build.sampler_of(run, s.model_cfg)
  cfg = sampler.forward_config("evaluate", mask_id=tok.mask_id, eos_id=tok.eos_id)
  sv, b = run.serve, run.decode.block_size
  prompt_len = -(-run.task.prompt_len // b) * b
  if cfg is None:          # whole requests, `serve.rows` of them a call
    shape = EngineShape(rows=0, waiting=sv.rows, prompt_len=prompt_len, iterations=1)
  else:
    shape = EngineShape(rows=sv.rows, waiting=sv.waiting_slots or 3 * sv.rows,
                        prompt_len=prompt_len, iterations=sv.iterations_per_call,
                        pool=sv.prompt_pool)
  return EngineParts(s, graphdef, params, cfg, shape, path)


def parse_models(flag: str) -> list[tuple[str, str]]:
  """(name, weights path) of each `NAME=DIR` of `--models=NAME=DIR,...` (launch/serve.py), in
  order; ConfigError for an entry without a name or a name given twice."""
  models = []
  for entry in (e.strip() for e in flag.split(",") if e.strip()):
    name, _, path = entry.partition("=")
    if not name.strip() or not path.strip():
      raise ConfigError(f"--models: {entry!r} is not NAME=DIR (e.g. --models=base=DIR,orl=DIR)")
    models.append((name.strip(), path.strip()))
  names = [n for n, _ in models]
  if len(set(names)) != len(names):
    raise ConfigError(f"--models names a model twice ({', '.join(names)}): each needs its own "
                      "name, the API's `model` field picks it")
  if not models:
    raise ConfigError("--models is empty: give NAME=DIR,... (e.g. --models=base=DIR,orl=DIR)")
  return models


def warm(engine, rule: UnmaskRule, token_id: int) -> float:
  """Compiles `engine`'s device call before the server says it serves, so that its first
  request does not wait for XLA -> seconds taken. The block engine runs an empty call (nothing
  admitted: its state is unchanged); a whole-request engine decodes a one-token prompt alone
  (the width of a request that arrives alone), its result dropped."""
  start = time.perf_counter()
  if isinstance(engine, BlockEngine):
    engine.call([], [])
  else:
    engine.call([Entry(0, np.array([token_id], np.int32), 0, 0, engine.cfg.gen_length, rule,
                       0.0)], [])
  return time.perf_counter() - start


def served_model(config, path: str = "", overridden: frozenset = frozenset()) -> Served:
  """The model `config` serves with the weights at `path` (`engine_parts`), its engine built
  and its scheduler started."""
  parts = engine_parts(config, path, overridden)
  s, shape = parts.setup, parts.shape
  run, tok = s.config, s.tokenizer
  engine = parts.engine()
  metrics = ServerMetrics(shape.rows or shape.waiting)
  if getattr(engine, "pool", None) is not None:    # the block engine's prompt pool
    metrics.watch_pool(engine.pool)
  scheduler = Scheduler(engine, tok, max_waiting=run.serve.max_waiting,
                        on_call=metrics.device_call)

  def load_params(new_path: str):
    weights_lib.resolve(new_path)
    _, new = initial_params(_setup(config, new_path, overridden))
    _same_tree(new, parts.params, new_path)
    return new

  block = parts.cfg is not None     # the block decoder takes a request's rule and temperature
  served = Served(
      name=run.serve.model_name or weights_lib.display_name(parts.path), tokenizer=tok,
      chat=run.task.chat if run.task.name != "tiny" else "none", scheduler=scheduler,
      metrics=metrics, rule=parts.rule, temperature=run.decode.temperature, samples=block,
      rules=RULES if block else (), prompt_len=shape.prompt_len,
      gen_length=engine.cfg.gen_length, load_params=load_params, source=parts.path,
      block_size=engine.cfg.block_size if block else None,
      max_body_bytes=run.serve.max_body_bytes)
  seconds = warm(engine, parts.rule, tok.eos_id)
  logging.info("serving %s (%s): prompts of %d tokens, responses of %d; compiled in %.1f s",
               served.name, parts.path, shape.prompt_len, engine.cfg.gen_length, seconds)
  scheduler.start()
  return served


class _Follower:
  """Polls `serve.watch` every `serve.watch_seconds` on a thread of its own and serves each
  newer set of weights (a checkpoint of a running run, or its final `params/`) through the
  scheduler's reload: the requests in flight finish on the weights they started with."""

  def __init__(self, served: Served, path: str, seconds: float):
    self.served, self.path, self.seconds = served, path, seconds
    self._stop = threading.Event()
    self.watcher = weights_watch.WeightsWatcher(path, self._serve)
    self._thread = threading.Thread(target=self._run, name="orl-watch", daemon=True)

  def _serve(self, version) -> None:
    engine = self.served.scheduler.engine
    params = weights_watch.load_version(self.path, version, engine.params)
    self.served.scheduler.reload(params).result()
    self.served.source = f"{self.path} ({version.kind} {version.version})"
    print(f"serving {self.served.source}", flush=True)

  def _run(self) -> None:
    while not self._stop.is_set():
      try:
        self.watcher.poll()
      except (OSError, ValueError) as e:     # a half-deleted or foreign checkpoint: next time
        logging.warning("serve.watch=%s: %s", self.path, e)
      self._stop.wait(self.seconds)

  def start(self) -> "_Follower":
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=60)


def start_watcher(served: Served, config):
  """A started follower of `serve.watch` (None when unset); its first poll serves the newest
  weights there unless they are the ones already served."""
  if not config.serve.watch:
    return None
  path = os.path.abspath(config.serve.watch)     # Orbax reads absolute paths only
  if not os.path.isdir(path):
    raise ConfigError(f"serve.watch={path}: no such directory (a run's work directory or its "
                      "params/ folder)")
  return _Follower(served, path, config.serve.watch_seconds).start()
