"""Evaluation (docs/method.md#metrics): accuracy, mean and pooled TPF, NFE, TPS per decoder setting.

TPS is generated tokens / wall seconds of the jitted decoder after an ahead-of-time compile
(compilation excluded); verification and detokenisation are not timed.

Forwards are counted both ways (docs/decoding.md#two-forward-counts) and both are reported: `tpf_*`
/ `nfe_mean` use the paper's count (denoising forwards plus one commit forward per decoded block,
the last one included: the headline), `tpf_*_denoise` / `nfe_mean_denoise` the authors' count
(denoising forwards only: what LLaDA2's `generate`, Fast-dLLM and transformers' DiffusionGemma
count), and `tpf_*_engine` / `nfe_mean_engine` the forwards the engine ran (commit forwards no later
block needs skipped). Every model is decoded by the decoder of its kind
(`decode_build.make_decoder`: the lock-step decoder, the per-row engine or DiffusionGemma's
uniform-noise sampler).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence, cast

import jax
import numpy as np
from tqdm import tqdm   # text bars: also in notebooks, where widgets may not render

from orl_jax import distributed

from orl_jax.config import build as run_config

from orl_jax.storage import trained_run
from orl_jax import sharding as sharding_lib
from orl_jax.data.pipeline import encode_prompts
from orl_jax.decode import build as decode_build
from orl_jax.unmasking import UnmaskRule

if TYPE_CHECKING:
  from orl_jax.tasks import Task


def _batches(n: int, batch_size: int):
  for start in range(0, n, batch_size):
    yield start, min(start + batch_size, n)


def _check_batch_split(batch_size: int, mesh) -> None:
  shards = sharding_lib.n_batch_shards(mesh.shape)
  if batch_size % shards:
    raise ValueError(f"eval.batch_size={batch_size} must be a multiple of the mesh's batch "
                     f"shards (mesh.data x mesh.fsdp x mesh.expert = {shards}): each shard "
                     "decodes an equal share of every batch")


def _pad_rows(x: np.ndarray, batch_size: int) -> np.ndarray:
  """Static batch shape: the last batch is padded by repeating the first rows (cyclically,
  when there are fewer rows than one batch)."""
  pad = (-len(x)) % batch_size
  return np.concatenate([x, x[np.arange(pad) % len(x)]]) if pad else x


class Decoded(NamedTuple):
  """Host arrays over all problems (every process) and the decode seconds."""
  tokens: np.ndarray        # [n, N] responses
  nfe: np.ndarray           # [n] forwards, the paper's count (one commit forward per block)
  nfe_engine: np.ndarray    # [n] forwards the engine ran
  n_generated: np.ndarray   # [n] tokens through the first EOS (DiffusionGemma: its non-padding
                            # tokens, transformers' count)
  nfe_denoise: np.ndarray   # [n] denoising forwards only (the authors' count)
  seconds: float


def _bar(total: int, desc: str, progress: bool, *, unit: str, leave: bool):
  """A progress bar (rate and time left) shown by process 0 when `progress`."""
  return tqdm(total=total, desc=desc, unit=unit, leave=leave, dynamic_ncols=True,
              disable=not (progress and distributed.is_lead_process()))


def decode_problems(graphdef, params, problems, task, config, rule: UnmaskRule, *,
                    batch_size: int, temperature: float = 0.0, seed: int = 0, progress=False,
                    mesh=None, model_cfg=None, desc: str = "") -> Decoded:
  """Decodes `problems` with the decoder of `model_cfg`'s family (default: the block decoder).

  With a `mesh`, every batch is one global array split over the mesh's batch axes: each
  process feeds, and its devices decode, only its rows (`sharding.process_rows`); the outputs
  are gathered. Without one, the batch is a host array every device sees whole. `progress`
  shows a bar over the problems (`desc` names it)."""
  config = run_config.build(config, rules=False)   # a ConfigDict from a caller
  prompts, valid = encode_prompts(problems, task.tokenizer, config.task.prompt_len)
  bar = _bar(len(problems), desc or f"decode {rule.label}", progress, unit="problem", leave=False)
  make = functools.partial(decode_build.make_decoder, config, model_cfg, graphdef, "evaluate",
                           mask_id=task.tokenizer.mask_id, eos_id=task.tokenizer.eos_id,
                           rule=rule, temperature=temperature)
  if decode_build.sampler_of(config, model_cfg).queued:
    with bar:
      return _decode_queue(make(n_rows=min(batch_size, len(prompts))), params, prompts, valid,
                           seed=seed, mesh=mesh, bar=bar)
  prompts, valid = _pad_rows(prompts, batch_size), _pad_rows(valid, batch_size)
  if mesh is not None:
    _check_batch_split(batch_size, mesh)
    rows = np.asarray(sharding_lib.process_rows(mesh, batch_size))
    feed = lambda p, v: sharding_lib.shard_batch((p[rows], v[rows]), mesh, batch_size)
  else:
    feed = lambda p, v: (p, v)
  run = make()
  key = jax.random.key(seed)
  compiled = run.lower(params, *feed(prompts[:batch_size], valid[:batch_size]), key).compile()
  outs, seconds = [], 0.0
  it = list(_batches(len(prompts), batch_size))
  for i, (s, e) in enumerate(it):
    batch = feed(prompts[s:e], valid[s:e])
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(params, *batch, jax.random.fold_in(key, i)))
    seconds += time.perf_counter() - t0
    bar.update(max(0, min(e, len(problems)) - s))      # padding rows are not problems
    outs.append(sharding_lib.to_host((out.tokens, out.nfe, out.nfe_engine, out.n_generated,
                                      out.nfe_denoise)))
  bar.close()
  tokens, nfe, nfe_engine, n_generated, nfe_denoise = (
      np.concatenate(x)[:len(problems)] for x in zip(*outs))
  return Decoded(tokens, nfe, nfe_engine, n_generated, nfe_denoise, seconds)


def _decode_queue(run, params, prompts, valid, *, seed: int, mesh, bar):
  """`decode.schedule = "per_row"`: every problem is one queue that `batch_size` rows decode,
  each row taking the next problem as soon as its response ends (`orl_jax.decode.per_row`); one
  jitted call of the engine `run`, timed after an ahead-of-time compile (so `bar` moves once,
  when it returns). Problem i samples with fold_in(key, i)."""
  if mesh is not None and sharding_lib.n_batch_shards(mesh.shape) > 1:
    raise ValueError("decode.schedule='per_row' decodes its queue on one batch shard: set "
                     "mesh.data = mesh.fsdp = mesh.expert = 1, or decode.schedule='lockstep'")
  key = jax.random.key(seed)
  compiled = run.lower(params, prompts, valid, key).compile()
  t0 = time.perf_counter()
  out = jax.block_until_ready(compiled(params, prompts, valid, key))
  seconds = time.perf_counter() - t0
  bar.update(len(prompts))
  tokens, nfe, nfe_engine, n_gen, denoise = sharding_lib.to_host(
      (out.tokens, out.nfe, out.nfe_engine, out.n_generated, out.nfe_denoise))
  return Decoded(tokens, nfe, nfe_engine, n_gen, denoise, seconds)


def _tpf_fields(n_gen, nfe, suffix: str) -> dict:
  nfe = np.maximum(nfe, 1)
  return {f"tpf_mean{suffix}": float(np.mean(n_gen / nfe)),
          f"tpf_pooled{suffix}": float(n_gen.sum() / nfe.sum()),
          f"nfe_mean{suffix}": float(nfe.mean())}


def evaluate_setting(graphdef, params, problems, task, config, rule: UnmaskRule, *,
                     batch_size: int, progress=False, mesh=None, model_cfg=None,
                     desc: str = "") -> dict:
  d = decode_problems(graphdef, params, problems, task, config, rule, batch_size=batch_size,
                      progress=progress, mesh=mesh, model_cfg=model_cfg, desc=desc)
  texts = [task.tokenizer.decode(t, stop_at_eos=True) for t in d.tokens]
  scores = distributed.shared_scores(   # verification split over the processes
      lambda idx: task.verifier.score_batch([problems[i] for i in idx], [texts[i] for i in idx]),
      len(problems), np.float64)
  n_gen = d.n_generated
  return {   # TPF: the paper's count (one commit forward per decoded block, the last included)
      "accuracy": float(scores.mean()),
      **_tpf_fields(n_gen, d.nfe, ""),
      # denoising forwards only: the authors' count (no commit forwards)
      **_tpf_fields(n_gen, d.nfe_denoise, "_denoise"),
      # the forwards the engine ran (commits no later block needs are skipped)
      **_tpf_fields(n_gen, d.nfe_engine, "_engine"),
      "tokens_mean": float(n_gen.mean()),
      "tps": float(n_gen.sum() / max(d.seconds, 1e-9)),
      "n_problems": len(problems),
      "batch_size": batch_size,
      "processes": jax.process_count(),
      "batch_shards": 1 if mesh is None else sharding_lib.n_batch_shards(mesh.shape),
      "device": jax.devices()[0].device_kind,
      "examples": [{"prompt": p.prompt, "response": r, "score": float(s)}
                   for p, r, s in list(zip(problems, texts, scores))[:3]],
  }


def evaluate(graphdef, params, task, config, settings: Sequence[str], *, progress=True,
             mesh=None, model_cfg=None, name: str = "") -> dict:
  """{setting: metrics} of the model on the first `eval.n_problems` evaluation problems; with a
  `mesh`, the problems of each batch are split over its batch axes (and so over processes).
  `model_cfg` (the run's `Setup.model_cfg`) picks its family's decoder. `progress` shows a bar
  over the settings (named `name`) and one over each setting's problems."""
  config = run_config.build(config, rules=False)   # a ConfigDict from a caller
  problems = task.eval_problems()
  problems = problems[:n_evaluated(config, len(problems))]
  results = {}
  title = f"evaluate {name}".strip()
  with _bar(len(settings), title, progress, unit="setting", leave=True) as bar:
    for label in settings:
      r = results[label] = evaluate_setting(
          graphdef, params, problems, task, config, UnmaskRule.parse(label),
          batch_size=config.eval.batch_size, progress=progress, mesh=mesh,
          model_cfg=model_cfg, desc=f"{title}: {label}")
      bar.set_postfix_str(f"{label} acc {r['accuracy']:.3f} TPF {r['tpf_pooled']:.2f}")
      bar.update(1)
  return results


def n_evaluated(config, n_available: int) -> int:
  """How many of the task's `n_available` evaluation problems are scored: `eval.n_problems`
  (0 = all of them); ConfigError, with the hint of the task, when it asks for more."""
  n = config.eval.n_problems
  if n <= n_available:
    return n or n_available
  from orl_jax.errors import ConfigError
  task = config.task
  hint = {"tiny": "raise task.tiny.n_eval",
          "jsonl": f"add problems to task.path={task.path!r}"}.get(
              task.name, "that is the whole test split")
  raise ConfigError(f"eval.n_problems={n} but the {task.name} evaluation set has {n_available} "
                    f"problems: set --config.eval.n_problems={n_available} (or 0 for all of "
                    f"them), or {hint}")


def evaluation_setup(config) -> str:
  """What makes rows of a results table comparable: the task (its data file's bytes
  included), the number of problems and the decoder's settings (`decode.*`), as one key."""
  task = config.task.to_dict()
  path = task.get("path", "")
  if path and os.path.isfile(path):
    with open(path, "rb") as f:
      task["path_sha256"] = hashlib.sha256(f.read()).hexdigest()
  return json.dumps([task, config.eval.n_problems, config.decode.to_dict()], sort_keys=True,
                    default=str)


SETUP_FILE = "results_setup.json"   # beside results.json: the set-up its rows were made with


def update_results(path: str, model_name: str, results: dict, setup: str | None = None) -> dict:
  """Merges `{model_name: results}` into the JSON file at `path` (created if missing). With a
  `setup` (`evaluation_setup`), rows made with another set-up are not kept: the file starts
  afresh (the old one moves to results.previous.json) and the change is printed."""
  all_results = {}
  if os.path.exists(path):
    with open(path) as f:
      all_results = json.load(f)
  setup_path = os.path.join(os.path.dirname(os.path.abspath(path)), SETUP_FILE)
  if setup is not None:
    recorded = None
    if os.path.exists(setup_path):
      with open(setup_path) as f:
        recorded = json.load(f).get("setup")
    if all_results and recorded != setup:
      os.replace(path, path.removesuffix(".json") + ".previous.json")
      print(f"{path}: the evaluation set-up (task, eval.n_problems or decode.*) differs from "
            f"the one its rows {sorted(all_results)} were made with; starting a new table",
            flush=True)
      all_results = {}
    write_json_atomic(setup_path, {"setup": setup})
  all_results[model_name] = results
  write_json_atomic(path, all_results)
  return all_results


def write_json_atomic(path: str, obj) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


# What a trained run records beside its evaluation (in every decoder setting's entry): the
# weighted AEC and anchor terms' shares of the objective, means over its logged updates.
RUN_FIELDS = ("aec_share", "rkl_share")


def seed_name(name: str, seed: int) -> str:
  """The results.json key of one seed's model before `merge_seeds` folds it into `name`."""
  return f"{name}@seed{seed}"


def split_seed_name(key: str) -> tuple[str, str | None]:
  """`seed_name` read back: (model name, seed) of a per-seed key; (key, None) for any other."""
  name, at, seed = key.rpartition("@seed")
  return (name, seed) if at and seed.isdigit() else (key, None)


def merge_seeds(path: str, name: str, keys: Sequence[str]) -> dict:
  """Replaces the per-seed entries `keys` of results.json by one model `name` whose usual
  fields are the seed means, with `<field>_std` for accuracy and pooled TPF and a `seeds` list
  of per-seed {seed, accuracy, tpf_pooled} (and the run's `RUN_FIELDS` where it recorded them).
  Returns all results (process 0 writes)."""
  with open(path) as f:
    all_results = merged_seeds(json.load(f), name, keys)
  if distributed.is_lead_process():
    write_json_atomic(path, all_results)
  return all_results


def merged_seeds(all_results: dict, name: str, keys: Sequence[str]) -> dict:
  """`merge_seeds` in memory: a copy of `all_results` with the entries `keys` replaced by the
  model `name` (seed means, `_std`, `seeds`)."""
  all_results = dict(all_results)
  per_seed = [all_results.pop(k) for k in keys]
  merged = {}
  for label in per_seed[0]:
    runs = [r[label] for r in per_seed]
    out: dict[str, Any] = {k: float(np.mean([r[k] for r in runs])) for k, v in runs[0].items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out.update({k: v for k, v in runs[0].items() if k not in out and k != "examples"})
    for k in ("accuracy", "tpf_pooled"):
      out[f"{k}_std"] = float(np.std([r[k] for r in runs]))
    out["seeds"] = [{"seed": split_seed_name(key)[1], "accuracy": r["accuracy"],
                     "tpf_pooled": r["tpf_pooled"], **{k: r[k] for k in RUN_FIELDS if k in r}}
                    for key, r in zip(keys, runs)]
    merged[label] = out
  all_results[name] = merged
  return all_results


def format_table(all_results: dict, reference: str = "base") -> str:
  """A plain-text table: model, setting, accuracy, TPF (mean / pooled), NFE, TPS, and the
  pooled-TPF ratio to the `reference` model at the same decoder setting when it was evaluated.
  TPF and NFE are the paper's count (+ one commit forward per block); `tpf_dn` / `nfe_dn` the
  authors' (denoising forwards only; '-' for results written before it was recorded)."""
  width = max([16] + [len(m) for m in all_results])
  head = (f"{'model':<{width}} {'decoder':<20} {'acc':>6} {'tpf_mean':>9} {'tpf_pool':>9} "
          f"{'vs_' + reference:>9} {'nfe':>6} {'tpf_dn':>7} {'nfe_dn':>7} {'tps':>9}")
  lines = [head, "-" * len(head)]
  ref = all_results.get(reference, {})
  for model, settings in all_results.items():
    for label, r in settings.items():
      ratio = (f"{r['tpf_pooled'] / ref[label]['tpf_pooled']:>8.2f}x" if label in ref
               else f"{'':>9}")
      spread = (f"  (+-{r['accuracy_std']:.3f} / +-{r['tpf_pooled_std']:.2f} over "
                f"{len(r['seeds'])} seeds)" if "seeds" in r else "")
      denoise = (f"{r['tpf_pooled_denoise']:>7.2f} {r['nfe_mean_denoise']:>7.1f}"
                 if "tpf_pooled_denoise" in r else f"{'-':>7} {'-':>7}")
      lines.append(f"{model:<{width}} {label:<20} {r['accuracy']:>6.3f} {r['tpf_mean']:>9.2f} "
                   f"{r['tpf_pooled']:>9.2f} {ratio} {r['nfe_mean']:>6.1f} {denoise} "
                   f"{r['tps']:>9.0f}" + spread)
  lines.append("tpf / nfe: the paper's count (denoising forwards + one commit forward per "
               "decoded block, so a block that commits one token per forward has tpf below 1); "
               "tpf_dn / nfe_dn: the authors' (denoising forwards only); tps: generated tokens "
               "per second")
  return "\n".join(lines)




def parse_compare(spec: str) -> list[tuple[str, str]]:
  """'DIR:name,DIR:name' -> [(DIR, name)]; a DIR without ':name' is named by what it is
  (`weights.display_name`: a run's name, or the folder's)."""
  from orl_jax.storage.weights import display_name
  out = []
  for item in filter(None, (s.strip() for s in spec.split(","))):
    path, _, name = item.rpartition(":") if ":" in item else (item, "", "")
    path = path or item
    out.append((path, name or display_name(path)))
  names = [n for _, n in out]
  if len(set(names)) != len(names):
    raise ValueError(f"eval.compare={spec!r} names a model twice: {names}")
  return out


def evaluate_models(config, models: Sequence[tuple[str, str]], *, progress=True,
                    overridden: frozenset = frozenset()) -> dict:
  """Evaluates each (weights path, name) with `eval.settings` on `config.task`, side by side;
  merges `{name: {setting: metrics}}` into WORKDIR/results.json (process 0; a new table when
  the evaluation set-up changed, `update_results`) and returns all results (on other
  processes: this call's). `overridden`: the fields the command line set
  (`trained_run.model_config_for`).
  With `progress`, says how many of the task's problems each model is scored on."""
  from orl_jax.setup.build import build_setup, initial_params
  path = os.path.join(config.workdir, "results.json")
  all_results = {}
  for weights, name in models:
    setup = build_setup(trained_run.model_config_for(config, weights, overridden,
                                         "eval.compare" if config.eval.compare else "model.path"))
    cfg = setup.config
    # build_setup's task is a tasks.Task; setup.build.Setup annotates it `object`
    n_available = len(cast("Task", setup.task).eval_problems())
    n = n_evaluated(cfg, n_available)          # before the weights load: a wrong size stops here
    if progress and distributed.is_lead_process():
      print(f"{name}: {weights} on {n} of the {n_available} {describe_task(cfg)} problems "
            f"(eval.n_problems={cfg.eval.n_problems}; 0 = all)", flush=True)
    graphdef, params = initial_params(setup)
    with sharding_lib.tracing_mesh(setup.mesh):
      results = evaluate(graphdef, params, setup.task, cfg, cfg.eval.settings,
                         progress=progress, mesh=setup.mesh, model_cfg=setup.model_cfg,
                         name=name)
    if distributed.is_lead_process():
      all_results = update_results(path, name, results, evaluation_setup(config))
    else:
      all_results[name] = results
  return all_results


def describe_task(config) -> str:
  """'jsonl (examples/x.jsonl)', 'gsm8k', 'tiny': the evaluation set, for messages."""
  path = config.task.path
  return f"{config.task.name} ({path})" if path else config.task.name
