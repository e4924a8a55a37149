"""Shared pieces of the real-model configs (llada.py, sdar.py, qwendlm.py).

They extend `configs/tiny.py`'s schema with the fields a real model needs. A family's facts
(attention layout, special tokens, decoder defaults, chat template) come from its registry
entry (`orl_jax/models/<family>/family.py`, listed in `orl_jax.models.families`); when
`model.path` is a Hugging Face directory its config.json decides the family and every
architecture field, and the config keeps only the run-time choices (dtypes, attention kernel,
residual pathway, model.moe.impl ...).
  model.hf_family       registry family (llada | qwen3 | llada2_moe) of a model without an HF
                        model.path (random init, params folder); an HF model.path's model_type wins
  model.hf_model_type   the config.json model_type an export declares without an HF model.path
                        ("" = the family's own; configs/sdar.py: "sdar", SDAR's own classes)
  model.hub_id          the HF repository the variant is (named when model.path is unset; training
                        then stops); "" = random weights are fine (the `:debug` variants)
  model.vocab_size      embedding rows (0 = the tokenizer's size)
  model.tokenizer       "" (model.path's tokenizer.json) | "byte" | "tiny" (the tiny task's
                        word tokenizer) | path to a tokenizer.json
  model.special_tokens  {mask, eos, pad, bos}: token strings or ids, resolved in the tokenizer;
                        set one to override it. "" (the default) = the id the model directory
                        declares (generation_config.json, then config.json: mask_token_id,
                        eos_token_id, pad_token_id, bos_token_id), else the family's
                        default. The run logs where each id came from.
  model.first_k_dense   leading dense-MLP layers of an MoE model (config.json first_k_dense_replace)
  model.norm_head       L2-normalise the head's vocabulary rows (LLaDA2 `norm_head`)
  model.moe.*           MoE feed-forward (n_experts = 0: dense): n_experts, top_k, expert_dim,
                        n_group, topk_group, n_shared, routed_scaling_factor (architecture), and
                        impl (ragged: grouped matmul, TPU/GPU | dense: every expert on every
                        token, tiny CPU models), freeze_router (no router updates). Experts
                        run expert-parallel exactly when mesh.expert > 1, exchanging tokens by
                        exchange (auto: ragged_all_to_all on TPU/GPU, all_to_all elsewhere |
                        all_to_all: padded to the worst case, runs everywhere |
                        ragged_all_to_all).
  task.path / chat / k_shot   user JSONL file (training data), chat template, GSM8K shots
  eval.compare          "DIR:name,DIR:name" models evaluated side by side (HF or params dirs)
  eval.random_init      evaluate a freshly initialised model when no weights are given (debug)
  eval.n_problems       problems scored (0 = the whole evaluation set: the real configs' default)
  loss.vocab_chunk      tokens per chunk of the large-vocabulary losses (0 = off)
  mesh.dcn              {data, fsdp, tensor} ways over the data-center network (hybrid mesh)
"""
import ml_collections

from configs import tiny
from orl_jax.config import sections as config_sections
from orl_jax.models import families


def real_base(hf_family: str, hub_id: str = "") -> ml_collections.ConfigDict:
  """The shared real-model config of registry family `hf_family` (its attention layout,
  decoder defaults and chat template; special tokens come from the model directory)."""
  family = families.get(hf_family)
  c = tiny.base_config()
  c.demo.base_checkpoint = ""
  m = c.model
  m.attention = family.attention
  m.hf_family = hf_family
  # config.json model_type an export declares when no model.path says ("" = the family's own)
  m.hf_model_type = ""
  m.hub_id = hub_id
  m.vocab_size = 0
  m.tokenizer = ""
  # the sections' fields with their defaults (orl_jax/config/sections.py), declared so that the
  # command line can set them; an MoE runs the ragged expert kernels
  m.special_tokens = ml_collections.ConfigDict(config_sections.SpecialTokens().to_dict())
  m.first_k_dense = 0
  m.norm_head = False
  m.moe = ml_collections.ConfigDict(config_sections.Moe(impl="ragged").to_dict())
  c.task.chat = family.chat
  c.decode.block_size = family.decode["block_size"]
  c.decode.rule, c.decode.rule_value = family.decode["rule"], family.decode["rule_value"]
  m.dtype = "bfloat16"
  m.param_dtype = "bfloat16"
  m.residual.mode = "adapter"
  m.remat = True                     # per-layer recomputation: replay rows of 4k tokens fit HBM
  c.task.name = "jsonl"
  c.task.path = ""
  c.task.k_shot = 0
  c.loss.vocab_chunk = 1024
  c.eval.compare = ""
  c.eval.random_init = False
  c.eval.n_problems = 0          # the whole evaluation set (GSM8K 1319, HumanEval 164, a file)
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
  m.rope_theta, m.norm_eps, m.qk_norm = rope_theta, norm_eps, qk_norm
  m.tie_embeddings = tie_embeddings
  m.residual.hidden = 0               # the adapter width F_r: 0 = d_model (also from config.json)


def debug_overrides(c, *, block_size: int, workdir: str):
  """A tiny random model of the same family on the offline tiny task: 2 ORL iterations on CPU.
  A random model never gets a verified answer, so every response trains (min_reward = 0)."""
  m = c.model
  m.d_model, m.n_layers, m.head_dim, m.mlp_dim = 32, 2, 8, 64
  m.n_heads, m.n_kv_heads = 4, (4 if c.model.attention == "bidirectional" else 2)
  m.vocab_size = 0
  m.residual.hidden = 0
  m.remat = False                     # tiny: nothing to save
  m.dtype = m.param_dtype = "float32"
  m.hub_id = ""                       # random weights: no weights directory needed
  # (special tokens: the tiny task's tokenizer brings its own)
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
  c.checkpoint.every = 0              # the last step's and an interrupted run's only: resumable
  c.eval.n_problems, c.eval.batch_size = 16, 16
  c.eval.settings = ("threshold_0.9", "threshold_0.7", "entropy_budget_0.5")
  c.eval.random_init = True
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
  c.workdir = workdir
