"""The demo's reports: seed means in results.json and the per-stage training summary."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from orl_jax import evaluate
from orl_jax.apps.demo import training_summary


def _setting(acc, tpf):
  return {"accuracy": acc, "tpf_pooled": tpf, "tpf_mean": tpf + 0.5, "nfe_mean": 32 / tpf,
          "tps": 1000.0, "n_problems": 512, "device": "cpu",
          "examples": [{"prompt": "p", "score": 1.0}]}


def test_merge_seeds_keeps_means_spreads_and_per_seed_figures(tmp_path):
  path = str(tmp_path / "results.json")
  runs = {0: (0.95, 6.0), 1: (0.93, 7.0), 2: (0.94, 8.0)}
  evaluate.update_results(path, "base", {"threshold_0.9": _setting(0.96, 3.0)})
  keys = []
  for seed, (acc, tpf) in runs.items():
    keys.append(evaluate.seed_name("orl", seed))
    evaluate.update_results(path, keys[-1], {"threshold_0.9": _setting(acc, tpf)})
  merged = evaluate.merge_seeds(path, "orl", keys)
  with open(path) as f:
    on_disk = json.load(f)
  assert on_disk == merged and sorted(merged) == ["base", "orl"]
  r = merged["orl"]["threshold_0.9"]
  accs, tpfs = [a for a, _ in runs.values()], [t for _, t in runs.values()]
  assert r["accuracy"] == pytest.approx(np.mean(accs))
  assert r["tpf_pooled"] == pytest.approx(np.mean(tpfs))
  assert r["tpf_mean"] == pytest.approx(np.mean(tpfs) + 0.5)
  assert r["accuracy_std"] == pytest.approx(np.std(accs))
  assert r["tpf_pooled_std"] == pytest.approx(np.std(tpfs))
  assert [s["seed"] for s in r["seeds"]] == ["0", "1", "2"]
  assert [s["tpf_pooled"] for s in r["seeds"]] == tpfs
  assert r["n_problems"] == 512 and r["device"] == "cpu" and "examples" not in r
  table = evaluate.format_table(merged)
  assert "over 3 seeds" in table and "2.33x" in table   # mean 7.0 / base 3.0


def test_training_summary_reads_start_end_and_the_anchor(tmp_path):
  path = tmp_path / "metrics.jsonl"
  with open(path, "w") as f:
    for step in range(1, 21):
      f.write(json.dumps({"step": step, "reward": step / 20, "residual_norm_ratio": 0.5,
                          "loss_rkl": 0.0 if step <= 10 else 0.002,
                          "updates_skipped": 1}) + "\n")
  s = training_summary(str(path))
  assert s["iterations"] == 20 and s["updates_skipped"] == 1
  assert s["reward_start"] == pytest.approx(0.075) and s["reward_end"] == pytest.approx(0.975)
  assert s["loss_rkl_mean_second_half"] == pytest.approx(0.002)
  assert s["residual_norm_ratio_start"] == pytest.approx(0.5)


def test_a_run_says_how_many_updates_it_applied_and_why_none():
  """The run's last line on its updates (train/summary.py) and the ORL bar's postfix: an
  iteration with no verified response shows that, not a loss of NaN."""
  from configs import tiny
  from orl_jax.train.orl import progress_text
  from orl_jax.apps.summary import updates_line
  c = tiny.get_config("orl")
  none = {"iterations": 4, "updates_skipped": 4.0, "reward_start": 0.0, "reward_end": 0.0}
  assert updates_line(c, none) == (
      "orl: 0/4 updates applied: no response verified (orl.min_reward=1); check the "
      "reward/answers of the task's problems and that the model can answer some of them")
  some = dict(none, updates_skipped=1.0, reward_end=0.5, rollout_tpf_start=2.0,
              rollout_tpf_end=2.5)
  assert updates_line(c, some) == ("orl: 3/4 updates applied (1 skipped: no response "
                                   "verified), reward 0.00 -> 0.50, rollout TPF 2.00 -> 2.50")
  scalars = {"reward": 0.0, "rollout_tpf": 1.25, "loss": float("nan")}
  assert progress_text(scalars, {}, 0, 3) == (
      "reward=0.00, tpf=1.25, no response verified: update skipped, updates applied=0/3")
  assert progress_text(dict(scalars, loss=0.5), {"loss": 0.5}, 3, 3) == (
      "reward=0.00, tpf=1.25, loss=0.500, updates applied=3/3")
  c.train.mode = "sft"
  assert updates_line(c, {"iterations": 10, "loss_start": 2.0, "loss_end": 1.0}) == (
      "sft: 10 updates, loss 2.000 -> 1.000")


def test_a_demo_stage_is_summarised_in_one_short_line():
  """The demo's line per trained stage holds the trends a reader checks first; the whole
  record is training_summary.json's."""
  from orl_jax.apps.summary import stage_line
  summary = {"iterations": 300, "reward_start": 0.91, "reward_end": 0.972,
             "rollout_tpf_start": 3.53, "rollout_tpf_end": 5.2, "residual_norm_ratio_start": 0.1,
             "residual_norm_ratio_end": 0.35, "loss_aec_start": 0.2, "loss_aec_end": 0.1,
             "aec_share": 0.031, "aec_to_ce": 0.05, "sec_rollout_mean": 1.0,
             "updates_skipped": 2.0, "mode": "orl"}
  line = stage_line("orl_seed0", summary)
  assert line == ("training orl_seed0: 300 iterations, reward 0.91 -> 0.97, rollout TPF 3.53 -> "
                  "5.20, residual norm ratio 0.100 -> 0.350, AEC 3.1% of the loss, 2 updates "
                  "skipped")
  assert stage_line("warmup", {"iterations": 4, "mode": "residual_warmup"}) == (
      "training warmup: 4 iterations")


@pytest.mark.slow
def test_demo_over_seeds_merges_them_and_a_rerun_evaluates_nothing_again(tmp_path, monkeypatch,
                                                                        capsys):
  """The demo pipeline end to end on smoke shapes (random base, 2-step stages, two rollout seeds,
  one ablation, one more run of each from a warm-up retrained with seed 2): results.json holds
  the seed means with per-seed figures and the other warm-up's runs beside them, and a second
  run over the same work directory reuses every evaluation (the demo resumes without
  re-evaluating)."""
  from orl_jax.apps import demo
  from tests.support.helpers import orl_smoke_config
  c = orl_smoke_config(tmp_path / "demo", steps=2)
  c.pipeline = "demo"
  c.demo.base_checkpoint, c.demo.warmup_checkpoint = "", ""
  c.demo.seeds, c.demo.ablations, c.demo.warmup_seed = (0, 1), ("no_kl",), 2
  c.eval.n_problems, c.eval.batch_size, c.eval.settings = 8, 8, ("threshold_0.9",)
  for stage in c.demo.stages:
    c.demo.stages[stage].train.steps, c.demo.stages[stage].train.warmup_steps = 2, 1
    c.demo.stages[stage].checkpoint.every = 2
  c.demo.stages.warmup.train.log_every = 1
  c.train.mode, c.model.residual.mode = "sft", "none"
  path = demo.run_demo(c, progress=False)
  results = json.load(open(path))
  # the run ends with the results table, then the paths of the plots and of results.json
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1] == f"results: {os.path.abspath(path)}" and lines[-2].startswith("plot: ")
  table = next(i for i, line in enumerate(lines) if line.startswith("model "))
  assert any(line.startswith("training orl") for line in lines[:table])   # summaries first
  assert max(len(line) for line in lines if line.startswith("training ")) < 200
  assert f"orl@seed0 model: {tmp_path / 'demo'}" in "\n".join(lines)   # where its weights are
  assert not any(line.startswith("training ") and not line.startswith("training curves: ")
                 for line in lines[table:])
  assert set(results) == {"base", "warmup", "orl", "orl_no_kl", "orl@warmup2",
                          "orl_no_kl@warmup2"}
  for name in ("orl", "orl_no_kl"):
    r = results[name]["threshold_0.9"]
    assert [s["seed"] for s in r["seeds"]] == ["0", "1"]
    assert r["accuracy"] == pytest.approx(np.mean([s["accuracy"] for s in r["seeds"]]))
    assert all(0 <= s["aec_share"] <= 1 and 0 <= s["rkl_share"] <= 1 for s in r["seeds"])
  assert {"aec_share", "rkl_share"} <= set(results["orl@warmup2"]["threshold_0.9"])
  assert results["orl_no_kl"]["threshold_0.9"]["ablation"]["against"] == "orl"

  def no_evaluation(*a, **k):
    raise AssertionError("a resumed demo evaluated a model again")
  monkeypatch.setattr(evaluate, "evaluate_models", no_evaluation)
  again = json.load(open(demo.run_demo(c, progress=False)))
  for name in results:
    for setting, r in results[name].items():
      assert again[name][setting]["accuracy"] == r["accuracy"]
      assert again[name][setting]["tpf_pooled"] == r["tpf_pooled"]


def test_ablation_table_compares_with_orl_and_the_paper_beyond_the_seed_spread():
  """Hand-computed rows: no_kl loses 3 points (spread 2) and 50% TPF (spread 10%): same way as
  the paper on both; no_aec gains TPF within the spread."""
  from orl_jax.apps.demo import ablation_table

  def model(acc, acc_std, tpf, tpf_std):
    return {"threshold_0.9": {"accuracy": acc, "accuracy_std": acc_std, "tpf_pooled": tpf,
                              "tpf_pooled_std": tpf_std, "seeds": []}}
  results = {"base": {"threshold_0.9": {"accuracy": 0.95, "tpf_pooled": 3.0}},
             "orl": model(0.95, 0.01, 6.0, 0.3), "orl_no_kl": model(0.92, 0.01, 3.0, 0.3),
             "orl_no_aec": model(0.95, 0.01, 6.3, 0.3),
             "orl@warmup3": {"threshold_0.9": {"accuracy": 0.94, "tpf_pooled": 5.5}}}
  rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
          for line in ablation_table(results).splitlines()[2:]}
  assert set(rows) == {"orl", "orl_no_kl", "orl_no_aec"}        # the base has no seeds
  assert rows["orl_no_kl"][:4] == ["0.920 ± 0.010", "3.00 ± 0.30", "-3.0", "-50%"]
  assert rows["orl_no_kl"][4:] == ["-6.7 / -47.0%", "same way / same way", ""]
  assert rows["orl_no_aec"][2:] == ["+0.0", "+5%", "– / -28.0%", "– / within spread", ""]
  assert rows["orl"][-1] == "0.940 / 5.50"          # the run from the other warm-up
  # the same figures as the ablation JSON records them, in each ablation's entry
  from orl_jax.apps.demo import with_ablation_effects
  recorded = with_ablation_effects(results)
  no_kl = recorded["orl_no_kl"]["threshold_0.9"]["ablation"]
  assert no_kl["against"] == "orl"
  assert no_kl["accuracy"] == pytest.approx({"change": -3.0, "spread": 2.0, "beyond_spread": True,
                                             "paper": -6.7, "vs_paper": "same way"})
  assert no_kl["tpf_pooled"] == pytest.approx({"change": -50.0, "spread": 10.0,
                                               "beyond_spread": True, "paper": -47.0,
                                               "vs_paper": "same way"})
  no_aec = recorded["orl_no_aec"]["threshold_0.9"]["ablation"]
  assert no_aec["accuracy"]["paper"] is None and no_aec["accuracy"]["vs_paper"] is None
  assert no_aec["tpf_pooled"]["beyond_spread"] is False
  assert no_aec["tpf_pooled"]["vs_paper"] == "within spread"
  for name in ("base", "orl", "orl@warmup3"):        # no seeds, or the reference itself
    assert recorded[name] == results[name]


def test_ablation_table_shows_each_terms_share_of_the_objective_averaged_over_seeds(tmp_path):
  """Each run's shares ride in its per-seed entry (`run`); merging the seeds averages them and
  keeps them per seed; the table shows the means, '–' for a model whose runs logged none."""
  from orl_jax.apps.demo import ablation_table
  path = str(tmp_path / "results.json")
  runs = {("orl", 0): {"aec_share": 0.002, "rkl_share": 0.01},
          ("orl", 1): {"aec_share": 0.004, "rkl_share": 0.03},
          ("orl_no_aec", 0): {"aec_share": 0.0, "rkl_share": 0.02}, ("orl_no_residual", 0): {}}
  for (name, seed), run in runs.items():
    evaluate.update_results(path, evaluate.seed_name(name, seed),
                            {"threshold_0.9": {**_setting(0.95, 6.0), **run}})
  for name in ("orl", "orl_no_aec", "orl_no_residual"):
    results = evaluate.merge_seeds(path, name, [evaluate.seed_name(n, s) for n, s in runs
                                                if n == name])
  r = results["orl"]["threshold_0.9"]
  assert (r["aec_share"], r["rkl_share"]) == pytest.approx((0.003, 0.02))
  assert [(s["aec_share"], s["rkl_share"]) for s in r["seeds"]] == [(0.002, 0.01), (0.004, 0.03)]
  assert "aec_share" not in results["orl_no_residual"]["threshold_0.9"]["seeds"][0]
  lines = ablation_table(results).splitlines()
  assert lines[0].endswith("| AEC / anchor share of the objective |")
  rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in lines[2:]}
  assert rows == {"orl": "0.30% / 2.00%", "orl_no_aec": "0.00% / 2.00%", "orl_no_residual": "–"}
  for name in results:      # runs that recorded no shares: no column
    for r in results[name].values():
      r.pop("aec_share", None)
  assert "share" not in ablation_table(results).splitlines()[0]


def test_study_report_reads_a_study_stopped_part_way(tmp_path):
  """Per-seed entries not merged yet are folded in memory (results.json is left as it is), the
  shares the runs recorded with them; the other warm-up's run stays beside the seed means."""
  from orl_jax.apps.demo import study_report

  def entry(acc, tpf, aec):
    return {"threshold_0.9": {"accuracy": acc, "tpf_pooled": tpf, "aec_share": aec,
                              "rkl_share": 0.01}}
  results = {"base": {"threshold_0.9": {"accuracy": 0.95, "tpf_pooled": 3.0}},
             "orl@seed0": entry(0.94, 6.0, 0.002), "orl@seed1": entry(0.96, 6.2, 0.004),
             "orl_no_aec@seed0": entry(0.95, 5.8, 0.0), "orl@warmup3": entry(0.90, 5.0, 0.5)}
  (tmp_path / "results.json").write_text(json.dumps(results))
  table, merged = study_report(str(tmp_path))
  assert merged["orl"]["threshold_0.9"]["accuracy"] == pytest.approx(0.95)
  assert merged["orl"]["threshold_0.9"]["aec_share"] == pytest.approx(0.003)
  assert [r["seed"] for r in merged["orl"]["threshold_0.9"]["seeds"]] == ["0", "1"]
  assert "| orl | 0.950 ± 0.010 | 6.10 ± 0.10 |  |  |  |  | 0.900 / 5.00 | 0.30% / 1.00% |" in table
  assert "| orl_no_aec | 0.950 ± 0.000 | 5.80 ± 0.00 | +0.0 | -5% |" in table
  effect = merged["orl_no_aec"]["threshold_0.9"]["ablation"]["tpf_pooled"]
  assert effect["change"] == pytest.approx(100 * (5.8 / 6.1 - 1))
  assert json.loads((tmp_path / "results.json").read_text()) == results
  with pytest.raises(FileNotFoundError, match="no results yet"):
    study_report(str(tmp_path / "nowhere"))
  # the launcher: the same table, written to WORKDIR/ablations.md, and the seeds it holds
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  run = lambda *a: subprocess.run([sys.executable, "launch/report.py", *a], cwd=root,
                                  capture_output=True, text=True, timeout=300,
                                  env=dict(os.environ, JAX_PLATFORMS="cpu"))
  out = run(f"--workdir={tmp_path}")
  assert out.returncode == 0, out.stderr
  assert (tmp_path / "ablations.md").read_text() == table + "\n"
  assert "seeds evaluated: orl 2, orl_no_aec 1" in out.stdout
  out = run(f"--workdir={tmp_path / 'nowhere'}")
  assert out.returncode != 0 and "no results yet" in out.stderr
