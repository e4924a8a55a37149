"""`launch/decode.py --prompt` as a new user runs it: a saved Hugging Face LLaDA directory (tiny,
random, with LLaDA's special-token ids) decodes with `--config.model.path=DIR` and no data file;
a directory with another hidden size and layer count loads with no shape override; SDAR,
QwenDLM and LLaDA2 (MoE) directories decode with their configs; the printed text equals
decoding the same prompt through the library API directly (loader, tokenizer, chat template,
block decoder), without the launcher's set-up. Also: `--models` side by side on the tiny
models, one-line errors for rejected options, DiffusionGemma's pointer to its sampler. Rerun
under other CPU numerics (`numerics`): the tests comparing the launcher's tokens and forward
counts with another decode; not the page, the errors, the special tokens, the side-by-side run."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from configs import llada
from orl_jax.data.hf_tokenizer import HFTokenizer
from orl_jax.data.pipeline import encode_prompts
from orl_jax.data.prompts import apply_chat
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.models import families, hf_read, hf_write
from orl_jax.models.build import build_model
from orl_jax.models.transformer import ModelConfig
from orl_jax.problem import Problem
from orl_jax.unmasking import UnmaskRule
from tests.support.hf import (BOS, EOS, OTHER_FAMILIES, PAD, PROMPT, SPECIALS, VOCAB,
                              byte_tokenizer, config_of, decode_launcher, write_llada_hf_dir)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the user changes for a quick CPU run (run-time choices, not shapes): the byte-level
# test tokenizer writes the chat template in ~100 tokens; one block of response
RUN_FLAGS = ("--config.task.prompt_len=128", "--config.decode.gen_length=32")


@pytest.fixture(scope="module")
def llada_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("llada_dirs")
  a, b = str(root / "a"), str(root / "b")
  write_llada_hf_dir(a, d_model=16, n_layers=2, seed=0)
  write_llada_hf_dir(b, d_model=24, n_layers=3, seed=1)   # not the config's shapes either
  return a, b


def library_decode(path: str, prompt: str, *, dtype: str, prompt_len: int, gen_length: int,
                   block_size: int, rule: UnmaskRule, chat: str, moe_impl: str = "dense",
                   eos_early_stop: bool = True, special: dict | None = None):
  """The same prompt decoded through the library directly, with the directory's family's
  block placement and threshold comparison (its registry entry): (text, NFE the paper's
  count, NFE the authors' count, generated tokens, the prompt's token count); `special`: the
  token ids to use (default: the family's)."""
  family = hf_read.family_of(path)
  rules = {k: families.get(family).decode[k] for k in ("block_placement", "commit_compare")}
  tok = HFTokenizer.from_file(path, special or families.get(family).special_tokens)
  arch = families.get(family).architecture_from_hf(hf_read.read_hf_config(path))
  if "moe" in arch:
    arch["moe"] = dataclasses.replace(arch["moe"], impl=moe_impl)
  cfg = ModelConfig(**arch, mask_id=tok.mask_id, hf_family=family, dtype=dtype,
                    param_dtype=dtype)
  graphdef, params = hf_read.load_model_params(path, family, cfg)
  tokens, valid = encode_prompts([Problem("p", apply_chat(prompt, chat))], tok, prompt_len)
  dcfg = DecodeConfig(gen_length=gen_length, block_size=block_size, mask_id=tok.mask_id,
                      eos_id=tok.eos_id, rule=rule, eos_early_stop=eos_early_stop, **rules)
  out = jax.device_get(lockstep_decoder(graphdef, dcfg)(params, tokens, valid, jax.random.key(0)))
  return (tok.decode(out.tokens[0], stop_at_eos=True), int(out.nfe[0]),
          int(out.nfe_denoise[0]), int(out.n_generated[0]), int(valid.sum()))


def _expected_line(path: str, config, special: dict | None = None) -> str:
  d = config.decode
  text, nfe, denoise, n, _ = library_decode(
      path, PROMPT, dtype=config.model.dtype, prompt_len=128, gen_length=32,
      block_size=d.block_size, rule=UnmaskRule(d.rule, d.rule_value), chat=config.task.chat,
      moe_impl=config.model.moe.impl, eos_early_stop=d.eos_early_stop, special=special)
  return (f"    -> {text}   [NFE paper {nfe} / denoising {denoise}, TPF "
          f"{n / max(nfe, 1):.2f} / {n / max(denoise, 1):.2f}]")


def _decode_py(command: list[str], tmp_path):
  """`command` (launch/decode.py and its flags) with RUN_FLAGS, which succeeds."""
  out = subprocess.run(
      [sys.executable, *command, *RUN_FLAGS, f"--html={tmp_path / 'page.html'}"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONIOENCODING="utf-8"),
      capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.numerics
def test_decode_prompt_from_hf_llada_directory_equals_library_decode(llada_dirs, tmp_path):
  """The README's command on a saved HF LLaDA directory, through the command line."""
  config = llada.get_config("8b-instruct")
  out = _decode_py(["launch/decode.py", "--config=configs/llada.py:8b-instruct",
                    f"--config.model.path={llada_dirs[0]}", f"--prompt={PROMPT}"], tmp_path)
  name = os.path.basename(llada_dirs[0])       # a model is named by its folder
  assert f"== {name} ({llada_dirs[0]}), decoder threshold_0.9" in out.stdout
  assert _expected_line(llada_dirs[0], config) in out.stdout, out.stdout
  assert (tmp_path / "page.html").is_file()


@pytest.mark.numerics
def test_other_hidden_size_and_layer_count_need_no_shape_override(llada_dirs):
  """A directory of another width and depth: the launcher's decode path (in process) reads
  them from config.json; the 8B config's shapes are not touched."""
  decode = decode_launcher()
  config = llada.get_config("8b-instruct")
  assert (config.model.d_model, config.model.n_layers) == (4096, 32)
  with config.unlocked():
    config.task.prompt_len, config.decode.gen_length = 128, 32
  decoded = decode.decode_model(config, "b", llada_dirs[1], [PROMPT])
  assert "\n".join(decoded.lines()).splitlines()[-1] == _expected_line(llada_dirs[1], config)
  assert decoded.tokens.shape == (1, 32)


def test_models_flag_decodes_tiny_models_side_by_side(tmp_path):
  """`--models=base=...,orl=...` with the tiny eval config: both params folders decode the
  same evaluation problems (their residual mode from meta.json) onto one trajectory page."""
  from configs import tiny
  decode = decode_launcher()
  config = tiny.get_config("eval")
  base, warmup = (os.path.join(ROOT, "assets", n) for n in ("tiny_base", "tiny_warmup"))
  models = decode.models_to_decode(config, f"base={base},warmup={warmup}")
  assert models == {"base": base, "warmup": warmup}
  decoded = [decode.decode_model(config, name, path, num=2) for name, path in models.items()]
  for d in decoded:
    assert len(d.texts) == 2 and all(s in (0.0, 1.0) for s in d.scores)
    assert np.all(d.nfe >= 2) and np.all(d.steps.max(axis=1) >= 0)
  assert decoded[0].prompts == decoded[1].prompts
  page = decode.write_page(str(tmp_path / "page.html"), decoded)
  html = open(page).read()
  assert "<b>base</b>" in html and "<b>warmup</b>" in html
  # the page explains itself: one legend, TPF's count, each model's decoder, forwards and TPF
  assert html.count("class='legend'") == 1 and "end of a block" in html
  assert "one commit forward per decoded block" in html
  for d in decoded:
    nfe, n = int(d.nfe.sum()), int(d.n_generated.sum())
    assert (f"decoder {d.rule_label}; forwards {nfe} (paper's count)" in html
            and f"TPF {n / nfe:.2f}" in html)


class _Letters:
  """A tokenizer whose token k reads as the k-th character from "a" (26, "{": EOS; 27: a
  byte-level piece of a character, which decodes to the replacement character)."""
  eos_id = 26

  def decode(self, ids, skip_special=False):
    del skip_special
    return "".join("\ufffd" if i == 27 else chr(ord("a") + i) for i in ids)


def test_the_page_marks_block_ends_on_one_colour_scale():
  """Block ends where the model's blocks end (the first block opened by `lead` prompt tokens),
  one colour scale over both models (the step of the slowest), an unreadable piece shown by
  its id, nothing after EOS."""
  from orl_jax.apps.trajectory_view import Decoded, page, _colour
  tokens = np.array([[0, 1, 2, 3, 4, 27, 26, 5]])
  quick = Decoded(name="quick", path="q", rule_label="threshold_0.9", prompts=["p"], texts=[""],
                  tokens=tokens, steps=np.array([[0, 0, 1, 1, 1, 2, 2, -1]]),
                  nfe=np.array([5]), nfe_denoise=np.array([3]), n_generated=np.array([7]),
                  scores=[float("nan")], tokenizer=_Letters(), block_size=4, lead=np.array([1]))
  slow = dataclasses.replace(quick, name="slow", steps=np.array([[0, 1, 2, 3, 4, 5, 6, -1]]))
  html = page([quick, slow])
  # lead 1: the first block holds 3 response tokens, so blocks end after positions 2 and 6
  ends = re.findall(r"<span class='t end'[^>]*>([^<]*)<sub>", html)
  assert ends == ["c", "{", "c", "{"], ends               # "{": the EOS token, shown, last
  assert "<sub>" in html and ">f<" not in html          # token 5 after EOS is not shown
  assert f"background:{_colour(2, 7)}'>f" not in html
  assert html.count(f"background:{_colour(6, 7)}") >= 1   # the slow model's last step: 6 of 7
  assert "&lt;27&gt;" in html                              # the byte-level piece, by its id
  assert "TPF 1.40 / 2.33" in html                         # 7 tokens / 5 and / 3 forwards


def test_rejected_options_say_what_to_set(llada_dirs, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = lambda *args: subprocess.run([sys.executable, "launch/decode.py", *args], cwd=ROOT,
                                     env=env, capture_output=True, text=True, timeout=300)
  old = run("--config=configs/llada.py:8b-instruct", f"--config.model.hf_dir={llada_dirs[0]}",
            f"--prompt={PROMPT}")
  lines = old.stderr.strip().splitlines()
  assert old.returncode == 2 and len(lines) == 1, old.stderr[-2000:]
  assert "no field 'hf_dir'" in lines[0] and "--config.model.path=DIR" in lines[0]
  missing = run("--config=configs/llada.py", f"--config.model.path={tmp_path / 'nowhere'}",
                f"--prompt={PROMPT}")
  lines = missing.stderr.strip().splitlines()
  assert missing.returncode == 1 and len(lines) == 1, missing.stderr[-2000:]
  assert "does not exist" in lines[0] and "Hugging Face model directory" in lines[0]


@pytest.mark.numerics
def test_a_diffusion_gemma_directory_decodes_with_its_uniform_noise_sampler(tmp_path):
  """launch/decode.py decodes a tiny random DiffusionGemma directory with the family's sampler:
  its tokens are `sampler.generate`'s for the same prompt and key, its forwards
  the sampler's denoising steps (+ one commit per decoded canvas: the paper's count), and the
  page colours a token by the last step of its canvas that accepted it (-1: none did; the
  canvas's output is its argmax)."""
  from orl_jax.models.diffusion_gemma import sampler
  from orl_jax.setup.build import build_setup, initial_params
  from orl_jax.models.diffusion_gemma.config import (FULL, SLIDING, AttentionSpec,
                                                     release_26b_a4b)
  layers = (AttentionSpec(SLIDING, 8, 1), AttentionSpec(FULL, 16, 1, "proportional", 1e6, 0.25))
  cfg = release_26b_a4b(vocab_size=VOCAB, d_model=16, n_heads=2, mlp_dim=24, n_experts=4,
                        top_k=2, expert_dim=8, layers=layers, sliding_window=8,
                        canvas_length=16, eos_ids=(EOS,), pad_id=PAD, bos_id=BOS)
  path = str(tmp_path / "diffusion_gemma")
  byte_tokenizer(str(tmp_path / "tokenizer.json"), VOCAB, SPECIALS)
  hf_write.export_hf(path, nnx.state(build_model(cfg, 0), nnx.Param), cfg, "diffusion_gemma",
                     tokenizer_file=str(tmp_path / "tokenizer.json"))
  config = config_of("diffusion_gemma", path)
  decoded = decode_launcher().decode_model(config, "dg", path, [PROMPT])
  assert decoded.tokens.shape == (1, 32) and "NFE paper" in decoded.lines()[-1]
  s = build_setup(config_of("diffusion_gemma", path), prompts=[PROMPT])
  graphdef, params = initial_params(s)
  tokens, valid = encode_prompts(s.task.eval_problems(), s.tokenizer, s.config.task.prompt_len)
  scfg = sampler.sampler_config(s.config, eos_ids=s.model_cfg.eos_ids,
                                   pad_id=s.model_cfg.pad_id, rollout=False)
  out = sampler.make_generator(graphdef, scfg)(params, tokens, jax.random.key(0), valid)
  np.testing.assert_array_equal(decoded.tokens, np.asarray(out.tokens))
  counted = np.asarray(out.trace.counted)                       # [N canvases, S steps, B]
  np.testing.assert_array_equal(decoded.nfe_denoise, counted.sum(axis=(0, 1)))
  np.testing.assert_array_equal(decoded.nfe, counted.sum(axis=(0, 1))
                                + counted.any(axis=1).sum(axis=0))
  accepted = np.asarray(out.trace.accepted)[:, :, 0] & counted[:, :, :1]   # [N, S, C]
  n_steps = counted.shape[1]
  want = np.full(decoded.tokens.shape[1], -1)
  for canvas, step in zip(*np.nonzero(accepted.any(axis=2))):
    c = cfg.canvas_length
    want[canvas * c:(canvas + 1) * c][accepted[canvas, step]] = canvas * n_steps + step
  np.testing.assert_array_equal(decoded.steps[0], want)
  assert (want >= 0).any()


def test_default_llada_config_reads_a_llada_8b_directory_with_its_special_tokens(llada_dirs):
  """configs/llada.py is written for LLaDA2 (mask 156895); given a LLaDA-8B directory the
  directory's family supplies the special tokens, while a user's own override still wins."""
  from orl_jax.setup.resolve import load_tokenizer
  config = llada.get_config()
  tok = load_tokenizer(config, llada_dirs[0], "llada")
  assert (tok.mask_id, tok.eos_id) == (126336, 126348)
  config.model.special_tokens.eos = "<|endoftext|>"
  assert load_tokenizer(config, llada_dirs[0], "llada").eos_id == 126081
  same = llada.get_config("8b-base")           # same family: the config's tokens as written
  assert load_tokenizer(same, llada_dirs[0], "llada").eos_id == 126081


@pytest.mark.numerics
@pytest.mark.parametrize("name", sorted(OTHER_FAMILIES))
def test_each_family_config_decodes_its_hf_directory(name, tmp_path):
  """configs/sdar.py (model_type sdar), configs/qwendlm.py (qwen3, tied head) and
  configs/llada.py's default LLaDA2.1-mini (MoE) on tiny random directories."""
  import importlib
  model_type, cfg, specials = OTHER_FAMILIES[name]
  path = str(tmp_path / name)
  byte_tokenizer(str(tmp_path / "tokenizer.json"), cfg.vocab_size, specials)
  hf_write.export_hf(path, nnx.state(build_model(cfg, 0), nnx.Param), cfg, cfg.hf_family,
                     tokenizer_file=str(tmp_path / "tokenizer.json"),
                     extra_config={"model_type": model_type})
  config = importlib.import_module(f"configs.{name}").get_config()
  with config.unlocked():
    config.task.prompt_len, config.decode.gen_length = 128, 32
  decoded = decode_launcher().decode_model(config, name, path, [PROMPT])
  assert decoded.lines()[-1].splitlines()[-1] == _expected_line(path, config)
  # blocks at absolute positions: the prompt is not a block multiple, so its last block is
  # shared with the first generated tokens; every decoded block adds one paper's forward
  *_, n_prompt = library_decode(path, PROMPT, dtype="float32", prompt_len=128, gen_length=32,
                                block_size=config.decode.block_size,
                                rule=UnmaskRule("threshold", 0.9), chat=config.task.chat)
  assert n_prompt % config.decode.block_size
  assert decoded.nfe[0] - decoded.nfe_denoise[0] >= 32 // config.decode.block_size


@pytest.mark.numerics
def test_a_directory_with_its_own_special_tokens_decodes_with_no_override(tmp_path):
  """A LLaDA2 directory whose tokenizer has 300 ids (the family's mask 156895 is none of them):
  config.json declares mask 299 and pad 298, generation_config.json the EOS ids [297, 295]
  (over config.json's 295). launch/decode.py decodes it with no override, prints where each id
  came from, and decodes as the library does with those ids given by hand; an override still
  wins."""
  from orl_jax.setup.resolve import load_tokenizer
  _, cfg, _ = OTHER_FAMILIES["llada"]
  cfg = dataclasses.replace(cfg, vocab_size=300, mask_id=299)
  path = str(tmp_path / "own_ids")
  byte_tokenizer(str(tmp_path / "tokenizer.json"), 300,
                 {295: "<|end|>", 297: "<|eos|>", 298: "<|pad|>", 299: "<|mask|>"})
  hf_write.export_hf(path, nnx.state(build_model(cfg, 0), nnx.Param), cfg, cfg.hf_family,
                     tokenizer_file=str(tmp_path / "tokenizer.json"),
                     extra_config={"eos_token_id": 295, "pad_token_id": 298})
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [297, 295], "max_new_tokens": 2048}, f)
  out = _decode_py(["launch/decode.py", "--config=configs/llada.py",
                    f"--config.model.path={path}", f"--prompt={PROMPT}"], tmp_path)
  assert ("  special tokens: mask=299 (config.json), eos=[297, 295] (generation_config.json), "
          "pad=298 (config.json)") in out.stdout, out.stdout
  config = llada.get_config()
  by_hand = {"mask": 299, "eos": 297, "pad": 298}
  assert _expected_line(path, config, by_hand) in out.stdout, out.stdout
  config.model.special_tokens.eos = "<|end|>"
  tok = load_tokenizer(config, path, "llada2_moe")
  assert (tok.mask_id, tok.eos_id, tok.pad_id) == (299, 295, 298)
  assert tok.origins["eos"] == "model.special_tokens.eos"
