"""The real-family configs: each `:debug` variant runs 2 ORL iterations of a tiny random model
of its family on CPU through the launcher (the CI smoke test of configs/{llada,sdar,qwendlm}.py),
and the full-size variants validate and describe the
published shapes (docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm)."""
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import llada, qwendlm, sdar
from orl_jax.config import build as run_config
from orl_jax.evaluate import evaluate_models
from orl_jax.train.entry import train
from orl_jax.apps.summary import report_run
from orl_jax.metrics import TPF_COUNT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# llada (the default config's family, an MoE) is the smoke path of the default run; the other
# two families' launcher runs are end-to-end repeats kept behind `slow` (their models, replay and
# lowered steps are covered by test_hf_models, test_train and test_lowering in the default run).
@pytest.mark.parametrize("name", ["llada", pytest.param("sdar", marks=pytest.mark.slow),
                                  pytest.param("qwendlm", marks=pytest.mark.slow)])
def test_debug_config_runs_two_orl_iterations(tmp_path, name):
  out = subprocess.run(
      [sys.executable, "launch/train.py", f"--config=configs/{name}.py:debug",
       f"--config.workdir={tmp_path}"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  # the last lines: the updates applied, how TPF counts, the phase times, every file written
  tail = out.stdout.strip().splitlines()[-7:]
  assert tail[0].startswith("orl: 2/2 updates applied, reward "), out.stdout
  assert tail[1] == f"rollout TPF: {TPF_COUNT}"
  assert tail[2].startswith("phase times (mean seconds per iteration): rollout "), out.stdout
  assert tail[3:] == [f"parameters: {tmp_path}/params", f"Hugging Face export: {tmp_path}/hf",
                      f"metrics: {tmp_path}/metrics.jsonl (TensorBoard: {tmp_path}/tensorboard)",
                      f"training curves: {tmp_path}/curves.png"], out.stdout
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["policy_lag"] == 0 and r["states_packed"] > 0 for r in rows)
  assert os.path.isfile(tmp_path / "params" / "params.safetensors")
  # runs of a registered family also write WORKDIR/hf with the family's official names
  from safetensors import safe_open
  with open(tmp_path / "hf" / "config.json") as f:
    model_type = json.load(f)["model_type"]
  with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
    names = set(f.keys())
  if name == "llada":   # the debug variant is a tiny LLaDA2 MoE (layer 0 dense)
    assert model_type == "llada2_moe"
    assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.expert_bias",
            "model.layers.3.mlp.experts.7.down_proj.weight",
            "model.layers.2.attention.query_key_value.weight", "lm_head.weight"} <= names
  else:   # SDAR's export declares SDAR's own classes, QwenDLM's transformers' Qwen3
    assert model_type == {"sdar": "sdar", "qwendlm": "qwen3"}[name]
    assert "model.layers.1.self_attn.q_norm.weight" in names
  _check_export_and_round_trip(tmp_path, name, model_type)


def _check_export_and_round_trip(tmp_path, name: str, model_type: str):
  """WORKDIR/hf holds the tokenizer files and declares the authors' classes; the exporter
  re-exports the run from its work directory with the family's default config (another size,
  task.name='jsonl' without a file: the run's settings come along, no task is read); the
  export reloads in the project and decodes as the run's parameters do."""
  hf_files = set(os.listdir(tmp_path / "hf"))
  assert {"config.json", "model.safetensors", "adapter.safetensors", "tokenizer.json",
          "tokenizer_config.json", "special_tokens_map.json"} <= hf_files
  with open(tmp_path / "hf" / "config.json") as f:
    hf_config = json.load(f)
  assert hf_config["orl_residual"]["mode"] == "adapter"
  assert ("auto_map" in hf_config) == (model_type != "qwen3")   # QwenDLM: transformers' Qwen3
  out = subprocess.run(
      [sys.executable, "launch/export.py", f"--config=configs/{name}.py",
       f"--params={tmp_path}", f"--out={tmp_path / 'hf_export'}"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == f"exported: {tmp_path / 'hf_export'}"
  assert hf_files == set(os.listdir(tmp_path / "hf_export"))
  from tests.support.hf import decode_launcher
  decode = decode_launcher()
  config = importlib.import_module(f"configs.{name}").get_config("debug")
  ours, export = (decode.decode_model(config, n, str(p), num=2)
                  for n, p in (("run", tmp_path), ("export", tmp_path / "hf_export")))
  np.testing.assert_array_equal(ours.tokens, export.tokens)
  np.testing.assert_array_equal(ours.nfe, export.nfe)
  assert ours.texts == export.texts


def test_debug_jsonl_trains_on_the_example_file_and_its_run_evaluates_and_decodes(tmp_path,
                                                                                  capsys):
  """configs/llada.py:debug-jsonl on the shipped examples/math_and_code.jsonl (one ORL
  iteration, the orl.min_reward of real runs: a random model verifies nothing, so no update
  is applied and the run says so); the run's work directory then evaluates and decodes with
  the variant's config, which names no model."""
  c = llada.get_config("debug-jsonl")
  c.task.path = os.path.join(ROOT, c.task.path)
  c.workdir, c.train.steps, c.orl.min_reward = str(tmp_path / "run"), 1, 1.0
  params_dir = train(c, progress=False)
  lines = report_run(c, params_dir)
  assert lines[0].startswith("orl: 0/1 updates applied: no response verified (orl.min_reward=1)")
  assert lines[1] == f"rollout TPF: {TPF_COUNT}"
  assert lines[2].startswith("phase times (mean seconds per iteration): rollout ")
  assert lines[3:] == [
      f"parameters: {params_dir}", f"Hugging Face export: {c.workdir}/hf",
      f"metrics: {c.workdir}/metrics.jsonl (TensorBoard: {c.workdir}/tensorboard)",
      f"training curves: {c.workdir}/curves.png"]
  assert os.path.getsize(f"{c.workdir}/curves.png") > 1000
  ev = llada.get_config("debug-jsonl")
  ev.task.path, ev.workdir, ev.eval.n_problems = c.task.path, str(tmp_path / "ev"), 4
  ev.model.path = c.workdir
  results = evaluate_models(ev, [(c.workdir, "run")])
  assert results["run"]["threshold_0.9"]["n_problems"] == 4
  said = capsys.readouterr().out
  assert f"run: {c.workdir} on 4 of the 36 jsonl ({c.task.path}) problems" in said
  from tests.support.hf import decode_launcher
  decoded = decode_launcher().decode_model(ev, "run", c.workdir, num=2)
  assert len(decoded.texts) == 2 and decoded.nfe.min() >= 1


@pytest.mark.parametrize("module,arg,attention,tied", [
    (llada, "8b-instruct", "bidirectional", False), (llada, "8b-base", "bidirectional", False),
    (sdar, "4b", "block_causal", False), (sdar, "8b", "block_causal", False),
    (qwendlm, "4b", "block_causal", True)])
def test_full_size_variants_validate(module, arg, attention, tied):
  c = module.get_config(arg)
  run_config.build(c)
  assert c.model.attention == attention and c.model.tie_embeddings == tied
  assert c.model.path == "" and c.loss.vocab_chunk > 0
  assert c.model.special_tokens.mask == ""      # the model directory's mask_token_id
  if module is sdar:
    assert c.decode.block_size == 4
  if module is llada:
    assert c.model.vocab_size == 126464
