"""Shared pieces of the real-model configs (llada.py, sdar.py, qwendlm.py).

They extend `configs/tiny.py`'s schema with the fields a real model needs:
  model.hf_dir          local HF model directory ("" = random init; `:debug` variants)
  model.hf_family       llada | qwen3 | "" (read from config.json's model_type)
  model.vocab_size      embedding rows (0 = the tokenizer's size)
  model.tokenizer       "" (hf_dir's tokenizer.json) | "byte" | path to a tokenizer.json
  model.special_tokens  {mask, eos, pad, bos}: token strings or ids, resolved in the tokenizer
  task.path / chat / k_shot   user JSONL file (training data), chat template, GSM8K shots
  eval.compare          "DIR:name,DIR:name" models evaluated side by side (HF or params dirs)
  eval.random_init      evaluate a freshly initialised model when no weights are given (debug)
  loss.vocab_chunk      tokens per chunk of the large-vocabulary losses (0 = off)
  mesh.dcn              {data, fsdp, tensor} ways over the data-center network (hybrid mesh)
"""
import ml_collections

from configs import tiny


def real_base(*, family: str, hf_family: str) -> ml_collections.ConfigDict:
  c = tiny.base_config()
  c.base_checkpoint = ""
  m = c.model
  m.family = family
  m.hf_dir = ""
  m.hf_family = hf_family
  m.vocab_size = 0
  m.tokenizer = ""
  m.special_tokens = ml_collections.ConfigDict(dict(mask="", eos="", pad="", bos=""))
  m.dtype = "bfloat16"
  m.param_dtype = "bfloat16"
  m.residual.mode = "adapter"
  c.task.name = "jsonl"
  c.task.path = ""
  c.task.chat = "none"
  c.task.k_shot = 0
  c.loss.vocab_chunk = 1024
  c.eval.compare = ""
  c.eval.random_init = False
  c.eval.settings = ("threshold_0.95", "threshold_0.9", "threshold_0.8", "threshold_0.7",
                     "entropy_budget_0.1", "entropy_budget_0.5", "entropy_budget_1.0")
  c.train.mode = "orl"
  c.train.steps = 300
  c.train.batch_size = 16
  c.train.lr = 1e-5
  c.train.warmup_steps = 10
  c.train.final_lr_fraction = 0.1
  c.train.log_every = 1
  c.checkpoint.every = 50
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1   # FSDP over every device
  return c


def set_shapes(c, *, d_model, n_layers, n_heads, n_kv_heads, head_dim, mlp_dim, vocab_size,
               rope_theta, norm_eps, qk_norm, tie_embeddings):
  m = c.model
  m.d_model, m.n_layers, m.n_heads, m.n_kv_heads = d_model, n_layers, n_heads, n_kv_heads
  m.head_dim, m.mlp_dim, m.vocab_size = head_dim, mlp_dim, vocab_size
  m.rope_theta, m.norm_eps, m.qk_norm, m.tie_embeddings = rope_theta, norm_eps, qk_norm, tie_embeddings
  m.residual.hidden = d_model


def debug_overrides(c, *, block_size: int, workdir: str):
  """A tiny random model of the same family on the offline tiny task: 2 ORL iterations on CPU.
  A random model never gets a verified answer, so every response trains (min_reward = 0)."""
  m = c.model
  m.d_model, m.n_layers, m.head_dim, m.mlp_dim = 32, 2, 8, 64
  m.n_heads, m.n_kv_heads = 4, (4 if c.model.family == "bidirectional" else 2)
  m.vocab_size = 0
  m.residual.hidden = 32
  m.dtype = m.param_dtype = "float32"
  c.task.name = "tiny"
  c.task.prompt_len = 32
  c.task.chat = "none"                # the debug tokenizers have no chat special tokens
  c.decode.block_size = block_size
  c.decode.gen_length = 16
  c.decode.temperature = 0.0
  c.orl.min_reward = 0.0
  c.orl.prompts_per_step, c.orl.group_size = 2, 3
  c.orl.rollout_rule, c.orl.rollout_rule_value = "threshold", 0.9
  c.replay.row_len, c.replay.n_rows, c.replay.max_states, c.replay.max_responses = 128, 8, 48, 6
  c.replay.states_per_response = 4
  c.loss.vocab_chunk = 64
  c.loss.conf_entropy = 0.99          # a random model is never confident: keep the KL term live
  c.train.steps, c.train.warmup_steps, c.train.log_every, c.train.lr = 2, 1, 1, 1e-3
  c.checkpoint.every = 0
  c.eval.n_problems, c.eval.batch_size = 16, 16
  c.eval.settings = ("threshold_0.9", "threshold_0.7", "entropy_budget_0.5")
  c.eval.random_init = True
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
  c.workdir = workdir
