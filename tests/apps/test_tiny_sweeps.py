"""benchmarks/tiny_sweeps.py's reporting (no training): runs of one name over seeds become mean
± std figures, a markdown row each and one colour per name in the plot; run specs parse."""
import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def sweeps():
  spec = importlib.util.spec_from_file_location(
      "tiny_sweeps", os.path.join(ROOT, "benchmarks", "tiny_sweeps.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(seed, acc, tpf, curve_acc, reward, aec_share=0.01, rkl_share=0.05):
  return {"seed": seed, "final": {"threshold_0.9": {"accuracy": acc, "tpf_pooled": tpf}},
          "curve": [{"updates": 100 * (i + 1), "accuracy": a, "tpf_pooled": tpf}
                    for i, a in enumerate(curve_acc)],
          "summary": {"aec_share": aec_share, "rkl_share": rkl_share},
          "reward_curve": [(5 * (i + 1), r) for i, r in enumerate(reward)]}


def _results():
  return {"full@seed0": _run(0, 0.60, 7.0, [0.5, 0.7], [1.0, 1.0, 0.5, 0.5]),
          "full@seed10": _run(10, 0.70, 7.4, [0.3, 0.5], [1.0, 1.0, 0.25, 0.75]),
          "full@seed2": _run(2, 0.80, 7.2, [0.4, 0.9], [1.0, 1.0, 0.0, 1.0]),
          "full_no_kl@seed0": _run(0, 0.50, 7.1, [0.2, 0.4], [1.0, 0.0, 0.5, 0.0], 0.02, 0.0)}


def test_seed_summary_means_and_stds(sweeps):
  s = sweeps.seed_summary(_results(), "full")
  assert s["n_seeds"] == 3
  assert [seed for seed, *_ in s["seeds"]] == [0, 2, 10]   # numeric seed order, not text order
  np.testing.assert_allclose(s["accuracy"], (0.7, np.std([0.6, 0.7, 0.8])), rtol=1e-12)
  np.testing.assert_allclose(s["tpf_pooled"], (7.2, np.std([7.0, 7.4, 7.2])), rtol=1e-12)
  np.testing.assert_allclose(s["curve_accuracy"][100], (0.4, np.std([0.5, 0.3, 0.4])),
                             rtol=1e-12)
  np.testing.assert_allclose(s["curve_accuracy"][200][0], 0.7, rtol=1e-12)
  np.testing.assert_allclose(s["curve_tpf_pooled"][200], (7.2, np.std([7.0, 7.4, 7.2])),
                             rtol=1e-12)
  # second half of each reward curve: 0.5, 0.5 / 0.25, 0.75 / 0.0, 1.0 -> every mean is 0.5
  np.testing.assert_allclose(s["reward_second_half"], (0.5, 0.0), atol=1e-12)
  one = sweeps.seed_summary(_results(), "full_no_kl")   # a prefix of another name is its own
  assert one["n_seeds"] == 1 and one["accuracy"][0] == 0.5


def test_seed_table_rows(sweeps):
  table = sweeps.seed_table(_results(), ["full", "full_no_kl"], base_tpf=3.6)
  lines = table.splitlines()
  assert len(lines) == 4
  assert lines[2].startswith("| full | 3 | 0.700 ± 0.082 | 7.20 ± 0.16 (2.00×) |")
  assert "| 1.0% / 5.0% |" in lines[2]
  assert lines[3].startswith("| full_no_kl | 1 | 0.500 ± 0.000 | 7.10 ± 0.00 (1.97×) |")
  with pytest.raises(KeyError, match="no run named 'missing'"):
    sweeps.seed_table(_results(), ["missing"], base_tpf=3.6)


def test_plot_writes_a_figure(sweeps, tmp_path):
  png = tmp_path / "curves.png"
  sweeps.plot(_results(), ["full", "full_no_kl"], str(png), title="t")
  assert png.stat().st_size > 10_000
  with pytest.raises(KeyError, match="--plot: no run named 'nope'"):
    sweeps.plot(_results(), ["nope"], str(tmp_path / "x.png"))


def test_parse_run(sweeps):
  assert sweeps.parse_run("hot:train.lr=3e-4,loss.w_aec=10,orl.rollout_rule=entropy_budget") == (
      "hot", {"train.lr": 3e-4, "loss.w_aec": 10, "orl.rollout_rule": "entropy_budget"})
  assert sweeps.parse_run("plain:") == ("plain", {})
