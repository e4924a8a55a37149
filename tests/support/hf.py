"""Hugging Face model directories of the tests (tiny, random, with their families' special
tokens at their ids) and the launchers that read them: a byte-level tokenizer.json with given
special tokens, LLaDA-8B directories, small configs of the other families, `launch/decode.py`
imported as a module."""
import dataclasses
import importlib.util
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from benchmarks.peers import llada_dir
from orl_jax.models import hf_write
from orl_jax.models.diffusion_gemma.config import FULL, SLIDING, AttentionSpec, release_26b_a4b
from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ModelConfig
from tests.support.helpers import ROOT

PROMPT = "What is 7 * 8?"
# LLaDA's special tokens at their ids (orl_jax/models/llada/family.py): a real directory's
LLADA_SPECIALS = {126336: "<|mdm_mask|>", 126348: "<|eot_id|>", 126081: "<|endoftext|>",
                  126080: "<|startoftext|>"}
LLADA_VOCAB = 126464
# a small MoE of the LLaDA2 family's configs below
TINY_MOE = MoEConfig(n_experts=4, top_k=2, expert_dim=8, n_group=2, topk_group=1,
                     n_shared=1, routed_scaling_factor=2.5)


def byte_tokenizer(path: str, vocab_size: int, specials: dict[int, str]) -> None:
  """tokenizer.json: the 256 byte tokens, `specials` at their ids (a family's), filler."""
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  names = [specials.get(i) or (alphabet[i] if i < len(alphabet) else f"<|r{i}|>")
           for i in range(vocab_size)]
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(names)}, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True) for t in specials.values()])
  tok.save(path)


def write_llada_hf_dir(path: str, *, d_model: int, n_layers: int, seed: int) -> ModelConfig:
  """A random LLaDA directory in the official layout: config.json (model_type llada),
  model.safetensors (the official torch [out, in] names), tokenizer.json."""
  cfg = ModelConfig(vocab_size=LLADA_VOCAB, d_model=d_model, n_layers=n_layers, n_heads=4,
                    n_kv_heads=4, head_dim=d_model // 4, mlp_dim=2 * d_model, mask_id=126336,
                    qk_norm=False, rope_theta=5e5, norm_eps=1e-5, attention="bidirectional",
                    hf_family="llada")
  rng = np.random.default_rng(seed)
  w = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)
  d, f = d_model, cfg.mlp_dim
  t = llada_dir.llada_tensors(
      n_layers, embedding=lambda: w(LLADA_VOCAB, d), norm=lambda: 1 + w(d),
      matrix=lambda name: w(*llada_dir.llada_shape(name, d=d, f=f, v=LLADA_VOCAB)))
  os.makedirs(path, exist_ok=True)
  save_file(t, os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json"), "w") as fh:
    json.dump(hf_write.hf_config_json(cfg, "llada"), fh)
  byte_tokenizer(os.path.join(path, "tokenizer.json"), LLADA_VOCAB, LLADA_SPECIALS)
  return cfg


def llada_cfg(**kw):
  cfg = ModelConfig(vocab_size=80, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=12,
                    mlp_dim=96, mask_id=79, rope_theta=5e5, norm_eps=1e-5, qk_norm=False,
                    tie_embeddings=False, attention="bidirectional")
  return dataclasses.replace(cfg, **kw)


def write_llada_dir(path, cfg: ModelConfig, seed=0, dtype=np.float32):
  """Random weights in LLaDA's HF layout (official names, torch [out, in] shapes)."""
  rng = np.random.default_rng(seed)
  d, f, v = cfg.d_model, cfg.mlp_dim, cfg.vocab_size
  hd = cfg.n_heads * cfg.head_dim
  w = lambda *s: (rng.normal(size=s) * 0.2).astype(dtype)
  t = llada_dir.llada_tensors(
      cfg.n_layers, embedding=lambda: w(v, d), norm=lambda: (1 + w(d)).astype(dtype),
      matrix=lambda name: w(*llada_dir.llada_shape(name, d=d, f=f, v=v, hd=hd)))
  os.makedirs(path, exist_ok=True)
  save_file(t, os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json"), "w") as fh:
    json.dump(hf_write.hf_config_json(cfg, "llada"), fh)
  return t


def decode_launcher():
  """launch/decode.py imported as a module (once per process: it defines absl flags)."""
  if "decode_launcher" in sys.modules:
    return sys.modules["decode_launcher"]
  sys.path.insert(0, os.path.join(ROOT, "launch"))
  spec = importlib.util.spec_from_file_location("decode_launcher",
                                                os.path.join(ROOT, "launch", "decode.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules["decode_launcher"] = module
  spec.loader.exec_module(module)
  return module


# other families' directories (random weights through the exporter, the family's special tokens
# at its ids): the config of each family decodes them with no shape override
QWEN3 = dict(vocab_size=600, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8,
             mlp_dim=24, mask_id=590, rope_theta=1e6, qk_norm=True, hf_family="qwen3")
QWEN3_SPECIALS = {590: "<|MASK|>", 591: "<|im_end|>", 592: "<|endoftext|>", 593: "<|im_start|>"}
OTHER_FAMILIES = {
    "sdar": ("sdar", ModelConfig(**QWEN3), QWEN3_SPECIALS),
    "qwendlm": ("qwen3", ModelConfig(**QWEN3, tie_embeddings=True), QWEN3_SPECIALS),
    "llada": ("llada2_moe", ModelConfig(
        vocab_size=157184, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8,
        mlp_dim=24, mask_id=156895, rope_theta=6e5, rope_fraction=0.5, qk_norm=True,
        moe=TINY_MOE, first_k_dense=1, hf_family="llada2_moe"),
              {156895: "<|mask|>", 156892: "<|endoftext|>"}),
}


# the vocabulary and special-token ids of `family_dir`'s directories
VOCAB = 300
BOS, MASK, EOS, PAD = 296, 297, 298, 299
SPECIALS = {BOS: "<|startoftext|>", MASK: "<|mdm_mask|>", EOS: "<|eot_id|>",
            PAD: "<|endoftext|>"}
CONFIGS = {   # family -> (a small model of it, the config that decodes it)
    "llada": (ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2,
                          head_dim=8, mlp_dim=24, mask_id=MASK, qk_norm=False, rope_theta=5e5,
                          norm_eps=1e-5, attention="bidirectional", hf_family="llada"),
               "llada:8b-instruct"),
    "llada2_moe": (ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2,
                               n_kv_heads=1, head_dim=8, mlp_dim=24, mask_id=MASK,
                               rope_theta=6e5, rope_fraction=0.5, qk_norm=True, moe=TINY_MOE,
                               first_k_dense=1, hf_family="llada2_moe"), "llada"),
    "qwen3": (ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1,
                          head_dim=8, mlp_dim=24, mask_id=MASK, rope_theta=1e6, qk_norm=True,
                          hf_family="qwen3"), "sdar"),
}


def family_dir(tmp_path, family: str) -> str:
  """config.json (our exporter's, declaring mask / eos / pad) and tokenizer.json of a small
  model of `family`; no weights (every test using it stops before they load)."""
  path = str(tmp_path / family)
  os.makedirs(path, exist_ok=True)
  if family == "diffusion_gemma":
    layers = (AttentionSpec(SLIDING, 8, 1), AttentionSpec(FULL, 16, 1, "proportional", 1e6,
                                                          0.25))
    cfg = release_26b_a4b(vocab_size=VOCAB, d_model=16, n_heads=2, mlp_dim=24, n_experts=4,
                          top_k=2, expert_dim=8, layers=layers, sliding_window=8,
                          canvas_length=16, eos_ids=(EOS,), pad_id=PAD, bos_id=BOS)
    config = cfg.to_hf()
  else:
    config = hf_write.hf_config_json(CONFIGS[family][0], family, {
        "eos_token_id": EOS, "pad_token_id": PAD, "bos_token_id": BOS})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  byte_tokenizer(os.path.join(path, "tokenizer.json"), VOCAB, SPECIALS)
  return path


def config_of(family: str, path: str):
  import importlib
  if family == "diffusion_gemma":
    from configs import diffusion_gemma
    c = diffusion_gemma.get_config("debug")
  else:
    module, _, variant = CONFIGS[family][1].partition(":")
    c = importlib.import_module(f"configs.{module}").get_config(variant or None)
  with c.unlocked():
    c.model.path = path
    c.task.prompt_len, c.decode.gen_length = 128, 32
  return c
