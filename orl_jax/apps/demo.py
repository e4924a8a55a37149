"""The embedded default, end to end: base model -> residual warm-up -> ORL (+ baselines,
ablations, over rollout seeds) -> evaluation with identical decoder settings -> results.json, a
table, training curves and the accuracy-vs-TPF plot."""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from typing import Any

from orl_jax import evaluate as eval_lib
from orl_jax import distributed
from orl_jax.models import params_io
from orl_jax.config import build as run_config
from orl_jax.apps import plots
from orl_jax.apps.summary import (
    CURVE_KEYS, WARMUP_CURVE_KEYS, stage_line, training_summary, write_report)
from orl_jax.train.entry import train
from orl_jax.setup.build import build_setup, check_compatible



def _repo_path(path: str) -> str:
  if os.path.isabs(path) or os.path.exists(path):
    return path
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  return os.path.join(here, path)


def stage_config(config, stage: str, init_from: str, seed: int | None = None):
  """A copy of `config` with the stage's overrides, its own work directory and start point.
  `seed`: the rollout noise and the order of the training problems (ORL prompts, SFT rows) of
  the stage; of a non-ORL stage also its init / masking-noise seed. The work directory gets a
  `seed{k}` folder."""
  cfg = copy.deepcopy(config)
  with cfg.unlocked():
    cfg.update(config.demo.stages[stage].to_dict())
    cfg.model.init_from = init_from
    cfg.workdir = os.path.join(config.workdir, stage)
    cfg.pipeline = "train"
    if seed is not None:
      cfg.workdir = os.path.join(cfg.workdir, f"seed{seed}")
      cfg.train.shuffle_seed = seed
      if cfg.train.mode == "orl":
        cfg.orl.rollout_seed = seed
      else:
        cfg.seed = seed
  return cfg


def base_params_dir(config, *, progress=True) -> str:
  """The committed base model if it matches the config, else one trained (and cached) in the
  work directory by the `sft` stage."""
  setup = build_setup(config)
  committed = _repo_path(config.demo.base_checkpoint) if config.demo.base_checkpoint else ""
  if committed and os.path.exists(os.path.join(committed, params_io.META_FILE)):
    try:
      check_compatible(committed, setup)
      return committed
    except ValueError as e:
      logging.warning("not using %s: %s", committed, e)
  cached = os.path.join(config.workdir, "base", "params")
  if os.path.exists(os.path.join(cached, params_io.META_FILE)):
    return cached
  sft_cfg = copy.deepcopy(config)
  with sft_cfg.unlocked():
    sft_cfg.train.mode = "sft"
    sft_cfg.model.residual.mode = "none"
    sft_cfg.model.init_from = ""
    sft_cfg.workdir = os.path.join(config.workdir, "base")
  return train(sft_cfg, progress=progress)


def warmup_params_dir(config, base: str, curves: list, *, progress=True) -> str:
  """The committed warm-up (`config.demo.warmup_checkpoint`, `make warmup`) when the base is the
  committed one and the vocabulary matches; else the warm-up stage trained (and cached) in the
  work directory."""
  warmup_checkpoint = _pipeline(config).warmup_checkpoint
  committed = _repo_path(warmup_checkpoint) if warmup_checkpoint else ""
  committed_base = _repo_path(config.demo.base_checkpoint) if config.demo.base_checkpoint else ""
  if (committed and os.path.exists(os.path.join(committed, params_io.META_FILE))
      and os.path.abspath(base) == os.path.abspath(committed_base)):
    try:
      check_compatible(committed, build_setup(config))
      return committed
    except ValueError as e:
      logging.warning("not using %s: %s", committed, e)
  return _train_stage(config, "warmup", base, None, progress, curves)[1]


def _eval_fingerprint(config, params_dir: str) -> str:
  """What an evaluation depends on: the weights' bytes and the evaluation settings."""
  digest = hashlib.sha256()
  for name in sorted(os.listdir(params_dir)):   # a resumed stage re-exports identical bytes
    digest.update(name.encode())
    with open(os.path.join(params_dir, name), "rb") as f:
      for chunk in iter(lambda: f.read(1 << 24), b""):
        digest.update(chunk)
  return json.dumps([digest.hexdigest(), list(config.eval.settings), config.eval.n_problems,
                     config.task.to_dict(), config.decode.to_dict()], sort_keys=True, default=str)


def evaluate_params(config, params_dir: str, name: str, *, run: dict | None = None,
                    progress=True) -> dict:
  """Evaluates the parameters in `params_dir` with `eval.settings`; merges into results.json,
  with `run` (the training figures of the run that made them, `run_figures`) in every
  setting's entry. A model already evaluated by this work directory with the same weights and
  settings (WORKDIR/eval_cache.json) is not evaluated again: a resumed demo only evaluates what
  is new."""
  cache_path = os.path.join(config.workdir, "eval_cache.json")
  cache = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      cache = json.load(f)
  key = _eval_fingerprint(config, params_dir)
  hit = cache.get(name)
  if hit and hit["fingerprint"] == key:
    logging.info("%s: evaluated before with these weights and settings; reusing", name)
    results = hit["results"]
  else:
    results = eval_lib.evaluate_models(config, [(params_dir, name)], progress=progress)[name]
    if distributed.is_lead_process():
      cache[name] = {"fingerprint": key, "results": results}
      eval_lib.write_json_atomic(cache_path, cache)
  results = {setting: {**r, **(run or {})} for setting, r in results.items()}
  if not distributed.is_lead_process():
    return {name: results}
  return eval_lib.update_results(results_path(config), name, results)


def results_path(config) -> str:
  return os.path.join(config.workdir, "results.json")


def _pipeline(config):
  """The demo's own section typed (`RunConfig.demo`: seeds, ablations, checkpoints); the stages
  themselves are trained from `config` (a ConfigDict each stage edits a copy of)."""
  return run_config.convert(config).demo


def demo_stages(config) -> list[str]:
  pipe = _pipeline(config)
  stages = ["orl"]
  if pipe.compare_offline:
    stages.append("rcd_offline")
  stages += [a for a in pipe.ablations if a not in stages]
  unknown = [s for s in stages if s not in config.demo.stages]
  if unknown:
    raise ValueError(f"unknown demo stages {unknown}; config.demo.stages has "
                     f"{list(config.demo.stages)}")
  return stages


def run_figures(metrics_path: str) -> dict:
  """The training figures a run records beside its evaluation in results.json
  (`evaluate.RUN_FIELDS`: each weighted term's share of the objective), where it logged them."""
  if not os.path.exists(metrics_path):
    return {}
  summary = training_summary(metrics_path)
  return {k: summary[k] for k in eval_lib.RUN_FIELDS if k in summary}


def _train_stage(config, stage: str, init_from: str, seed: int | None, progress: bool,
                 curves: list) -> tuple[str, str, dict]:
  """(eval name, params folder, `run_figures`) of one trained stage; its training curves go to
  `curves`."""
  cfg = stage_config(config, stage, init_from, seed)
  params_dir = train(cfg, progress=progress)
  metrics = os.path.join(cfg.workdir, "metrics.jsonl")
  label = run_label(stage, seed)
  png = os.path.join(config.workdir, f"curves_{label}.png")
  keys = {"orl": CURVE_KEYS, "residual_warmup": WARMUP_CURVE_KEYS}.get(cfg.train.mode)
  if os.path.exists(metrics) and distributed.is_lead_process():
    curves.append((label, cfg.train.mode, metrics,
                   plots.plot_training_curves(metrics, png, keys=keys, title=label)))
  return cfg.eval.name, params_dir, run_figures(metrics)


def run_label(stage: str, seed: int | None) -> str:
  """A trained stage's label in training_summary.json and its curves' file name."""
  return stage if seed is None else f"{stage}_seed{seed}"


def _report_training(config, curves: list) -> None:
  """training_summary.json (per stage run) and the ORL runs' reward curves side by side."""
  if not distributed.is_lead_process() or not curves:
    return
  summary = {label: dict(training_summary(path), mode=mode) for label, mode, path, _ in curves}
  with open(os.path.join(config.workdir, "training_summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  orl_runs = {label: path for label, mode, path, _ in curves if mode == "orl"}
  if len(orl_runs) > 1:
    plots.plot_curves_side_by_side(orl_runs, os.path.join(config.workdir, "reward_curves.png"),
                                   title="ORL runs side by side")
  for label, s in summary.items():
    print(stage_line(label, s))
  print(f"training summaries: {os.path.join(config.workdir, 'training_summary.json')}")


# The paper's Table 3(a): what removing each term does to ORL (accuracy in points, TPF in %).
PAPER_ABLATIONS = {"orl_no_aec": (None, -28.0), "orl_no_kl": (-6.7, -47.0),
                   "orl_no_residual": (None, -41.0)}


def _moves(delta: float, spread: float, paper: float | None) -> str | None:
  if paper is None:
    return None
  if abs(delta) <= spread:
    return "within spread"
  return "same way" if delta * paper > 0 else "opposite"


def ablation_effect(name: str, r: dict, ref: dict, reference: str = "orl") -> dict:
  """What removing a term did, as the ablation JSON records it: model `name`'s seed means `r`
  against `reference`'s `ref` (one decoder setting, both over seeds). Per metric (accuracy in
  points, pooled TPF in % of the reference's): the change, the seed spread (the sum of the two
  models' stds), whether the change is beyond it, the paper's figure (Table 3(a)) where it
  reports one, and how ours moves against it ("same way", "opposite", "within spread")."""
  p_acc, p_tpf = PAPER_ABLATIONS.get(name, (None, None))
  out: dict[str, Any] = {"against": reference,
                         "units": "accuracy: points; tpf_pooled: % of the reference's"}
  for key, change, spread, paper in (
      ("accuracy", 100 * (r["accuracy"] - ref["accuracy"]),
       100 * (r["accuracy_std"] + ref["accuracy_std"]), p_acc),
      ("tpf_pooled", 100 * (r["tpf_pooled"] / ref["tpf_pooled"] - 1),
       100 * (r["tpf_pooled_std"] + ref["tpf_pooled_std"]) / ref["tpf_pooled"], p_tpf)):
    out[key] = {"change": change, "spread": spread, "beyond_spread": abs(change) > spread,
                "paper": paper, "vs_paper": _moves(change, spread, paper)}
  return out


def with_ablation_effects(all_results: dict, reference: str = "orl") -> dict:
  """A copy of `all_results` where every setting entry of a model evaluated over seeds (other
  than `reference`) holds its `ablation_effect` ("ablation") against `reference` there."""
  out = dict(all_results)
  ref = all_results.get(reference, {})
  for name, settings in all_results.items():
    if name == reference:
      continue
    out[name] = {setting: ({**r, "ablation": ablation_effect(name, r, ref[setting], reference)}
                           if "seeds" in r and "seeds" in ref.get(setting, {}) else r)
                 for setting, r in settings.items()}
  return out


def ablation_table(all_results: dict, setting: str = "threshold_0.9",
                   reference: str = "orl") -> str:
  """A markdown table of every model evaluated over seeds at `setting`: accuracy and pooled TPF
  as mean ± std over seeds, the change against `reference` (points; % of TPF), the paper's
  direction where it reports one, and whether ours moves the same way by more than the seed
  spread (`ablation_effect`); then the model's run from a warm-up retrained with another seed
  (`warmup_seed`), where there is one; last, where the runs recorded them (`run_figures`), what
  AEC and the anchor weighed in training: each one's share of the objective, the mean over the
  model's seeds."""
  ref = all_results[reference][setting]
  rows = {name: r[setting] for name, r in all_results.items()
          if "seeds" in r.get(setting, {})}
  shares = any("aec_share" in r for r in rows.values())
  head = ("| model | accuracy | TPF (pooled) | Δ acc (pts) | Δ TPF | paper Δ acc / Δ TPF | "
          "moves as the paper (acc / TPF) | other warm-up (acc / TPF) |"
          + (" AEC / anchor share of the objective |" if shares else "") + "\n"
          "|---|---|---|---|---|---|---|---|" + ("---|" if shares else ""))
  lines = [head]
  for name, r in rows.items():
    cells = ["", "", "", ""]
    if name != reference:
      effect = ablation_effect(name, r, ref, reference)
      acc, tpf = effect["accuracy"], effect["tpf_pooled"]
      cells = [f"{acc['change']:+.1f}", f"{tpf['change']:+.0f}%",
               " / ".join("–" if e["paper"] is None else f"{e['paper']:+.1f}{u}"
                          for e, u in ((acc, ""), (tpf, "%"))),
               " / ".join(e["vs_paper"] or "–" for e in (acc, tpf))]
    others = [v[setting] for k, v in all_results.items()
              if k.startswith(f"{name}@warmup") and setting in v]
    other = " ".join(f"{o['accuracy']:.3f} / {o['tpf_pooled']:.2f}" for o in others)
    lines.append(f"| {name} | {r['accuracy']:.3f} ± {r['accuracy_std']:.3f} | "
                 f"{r['tpf_pooled']:.2f} ± {r['tpf_pooled_std']:.2f} | "
                 + " | ".join(cells) + f" | {other} |"
                 + (f" {_shares_cell(r)} |" if shares else ""))
  return "\n".join(lines)


def _shares_cell(r: dict) -> str:
  if "aec_share" not in r:
    return "–"
  return f"{100 * r['aec_share']:.2f}% / {100 * r['rkl_share']:.2f}%"


def study_report(workdir: str, setting: str = "threshold_0.9") -> tuple[str, dict]:
  """(ablation table, results) of a demo work directory run over seeds, finished or not:
  results.json with the per-seed entries a stopped study has not merged yet folded in memory
  (models whose seeds are all there and those part-way alike; the `seeds` list says which) and
  each ablation's effect recorded (`with_ablation_effects`)."""
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no results yet (run the demo with seeds first)")
  with open(path) as f:
    all_results = json.load(f)
  groups: dict[str, list[str]] = {}
  for key in all_results:
    name, seed = eval_lib.split_seed_name(key)
    if seed is not None:
      groups.setdefault(name, []).append(key)
  for name, keys in groups.items():
    all_results = eval_lib.merged_seeds(all_results, name, keys)
  if "orl" not in all_results:
    raise ValueError(f"{path}: no seed of the full ORL run ('orl') is evaluated yet")
  return ablation_table(all_results, setting), with_ablation_effects(all_results)


def _write_ablation_table(config, all_results: dict) -> None:
  """WORKDIR/ablations.md when the demo ran over seeds (printed too)."""
  if not _pipeline(config).seeds or "orl" not in all_results or not distributed.is_lead_process():
    return
  table = ablation_table(all_results)
  with open(os.path.join(config.workdir, "ablations.md"), "w") as f:
    f.write(table + "\n")
  print(table)


def warmup_seed_name(name: str, seed: int) -> str:
  """The results.json key of a model trained from the warm-up retrained with `seed`."""
  return f"{name}@warmup{seed}"


def _other_warmup_runs(config, base: str, stages, progress: bool, curves: list) -> dict | None:
  """With `warmup_seed` >= 0: the warm-up retrained with that seed (its init, masking noise and
  data order), then one more run of every stage that starts from the warm-up, from it, with
  that seed; kept beside the seed means (`warmup_seed_name`), not merged into them."""
  pipe = _pipeline(config)
  seed = pipe.warmup_seed
  from_warmup = [st for st in stages if config.demo.stage_start[st] == "warmup"]
  if seed < 0 or not from_warmup:
    return None
  if seed in pipe.seeds:
    raise ValueError(f"demo.warmup_seed={seed} is also one of demo.seeds={pipe.seeds}: pick "
                     "another, the two runs would share a work directory")
  warmup = _train_stage(config, "warmup", base, seed, progress, curves)[1]
  all_results = None
  for stage in from_warmup:
    name, params_dir, run = _train_stage(config, stage, warmup, seed, progress, curves)
    all_results = evaluate_params(config, params_dir, warmup_seed_name(name, seed), run=run,
                                  progress=progress)
  return all_results


def run_demo(config, *, progress=True) -> str:
  """Base -> warm-up -> stages (each over `config.demo.seeds`) -> evaluation, each stage with a
  progress bar. Ends by printing the training summaries, the results table and the paths of the
  plots and of results.json, which it returns."""
  os.makedirs(config.workdir, exist_ok=True)
  base = base_params_dir(config, progress=progress)
  print(f"base model: {base}")
  trained = {"base": base}
  starts = {"base": base}
  curves: list = []   # (label, mode, metrics file, curves plot) of each trained stage
  stages = demo_stages(config)
  if any(config.demo.stage_start[st] == "warmup" for st in stages):
    starts["warmup"] = warmup_params_dir(config, base, curves, progress=progress)
    print(f"warmed-up model: {starts['warmup']}")
    trained[config.demo.stages.warmup.eval.name] = starts["warmup"]
  for name, params_dir in trained.items():
    evaluate_params(config, params_dir, name, progress=progress)
  # Seeds outermost and each model evaluated as soon as it is trained: a run stopped part-way
  # leaves every stage of the first seeds in results.json (per-seed keys until merged).
  seeds = _pipeline(config).seeds or (None,)
  seed_groups: dict[str, list[str]]
  seed_groups, all_results = {}, {}
  for seed in seeds:
    for stage in stages:
      name, params_dir, run = _train_stage(config, stage, starts[config.demo.stage_start[stage]],
                                           seed, progress, curves)
      key = name if seed is None else eval_lib.seed_name(name, seed)
      print(f"{key} model: {params_dir}")
      all_results = evaluate_params(config, params_dir, key, run=run, progress=progress)
      if seed is not None:
        seed_groups.setdefault(name, []).append(key)
  for name, keys in seed_groups.items():
    all_results = eval_lib.merge_seeds(results_path(config), name, keys)
  all_results = _other_warmup_runs(config, base, stages, progress, curves) or all_results
  if seed_groups and "orl" in all_results:    # each ablation's effect, kept in results.json
    all_results = with_ablation_effects(all_results)
    if distributed.is_lead_process():
      eval_lib.write_json_atomic(results_path(config), all_results)
  _, png = write_report(all_results, config.workdir,
                        title=f"{config.task.name}: accuracy vs tokens per forward")
  _report_training(config, curves)   # one line per trained stage, before the tables
  print(eval_lib.format_table(all_results))
  _write_ablation_table(config, all_results)
  for *_, png_curves in curves:
    print(f"training curves: {png_curves}")
  print(f"plot: {png}")
  path = results_path(config)
  print(f"results: {os.path.abspath(path)}")
  return path
