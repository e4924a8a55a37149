"""LLaDA: LLaDA2.x-mini (MoE, block diffusion; the paper's LLaDA) and LLaDA-8B (dense,
bidirectional). DESIGN §4; the model facts come from the family registry
(`orl_jax.models.families`: `llada2_moe`, `llada`).

Launch lines:
  python launch/train.py --config=configs/llada.py --config.model.path=/path/LLaDA2.1-mini \
      --config.task.path=my_train.jsonl                        # LLaDA2.1-mini (the default)
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/train.py \
      --config=configs/llada.py:2.1-mini --config.dry_run=True # per-device memory, fsdp=8
  python launch/train.py --config=configs/llada.py:2.1-mini --config.dry_run=True \
      --config.mesh.fsdp=8 --config.mesh.expert=8              # fsdp=8 x expert=8 (64 devices)
  python launch/train.py --config=configs/llada.py:8b-instruct \
      --config.model.path=/path/LLaDA-8B-Instruct --config.task.path=my_train.jsonl
  python launch/eval.py  --config=configs/llada.py:8b-instruct --config.task.name=gsm8k \
      --config.eval.compare=/path/LLaDA-8B-Instruct:base,work_dirs/llada/hf:orl
  python launch/train.py --config=configs/llada.py:debug       # tiny random MoE, 2 ORL steps (CPU)
  python launch/decode.py --config=configs/llada.py:8b-instruct \
      --config.model.path=/path/LLaDA-8B-Instruct --prompt="What is 7 * 8?"
  python launch/decode.py --config=configs/llada.py --config.model.path=/path/LLaDA2.1-mini \
      --prompt="What is 7 * 8?"                               # any LLaDA / LLaDA2 directory
  python launch/eval.py  --config=configs/llada.py:8b-instruct --config.train.mode=eval \
      --config.model.path=/path/LLaDA-8B-Instruct --config.decode.cache=dual  # Fast-dLLM cache

LLaDA-8B is bidirectional: `decode.cache` (none | prefix | dual, declared in configs/tiny.py)
chooses Fast-dLLM's approximate prefix or dual cache for evaluation; ORL rollouts need "none".

With `model.path` a Hugging Face directory, its config.json decides the family and every shape
(the values below are for sizing and for random-init runs), so a smaller or larger checkpoint
needs no shape override; the run exports WORKDIR/hf with the official tensor names.

Variants (`get_config(arg)`):
  "2.1-mini" (default): inclusionAI/LLaDA2.1-mini, 16B total / ~1.4B active, block-causal,
              block 32, threshold 0.95 (the official default).
  "2.0-mini"  : inclusionAI/LLaDA2.0-mini, same architecture.
  "8b-instruct": GSAI-ML/LLaDA-8B-Instruct, chat template 'llada', EOS = <|eot_id|> (126348).
  "8b-base"   : GSAI-ML/LLaDA-8B-Base, no chat template, EOS = <|endoftext|> (126081).
  "debug"     : a tiny random LLaDA2 MoE (4 layers, 1 dense, 8 experts top-2, 1 shared, 2 groups
              keep 1) on the tiny task: 2 ORL iterations on CPU.
"""
from configs import dlm_common

VARIANTS = ("2.1-mini", "2.0-mini", "8b-instruct", "8b-base", "debug")


def _llada2_mini(c):
  """LLaDA2.x-mini shapes (DESIGN §4)."""
  dlm_common.set_shapes(c, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, head_dim=128,
                        mlp_dim=5120, vocab_size=157184, rope_theta=6e5, norm_eps=1e-6,
                        qk_norm=True, tie_embeddings=False)
  m = c.model
  m.rope_fraction = 0.5            # partial_rotary_factor: rotate_half on the first 64 dims
  m.first_k_dense = 1
  m.norm_head = False
  # n_group is not stated in DESIGN §4 (it says groups scored by their top-2, keep 4); 8 is
  # our reading of the released config.json, which decides whenever model.path is given.
  m.moe.update(dict(n_experts=256, top_k=8, expert_dim=512, n_group=8, topk_group=4,
                    n_shared=1, routed_scaling_factor=2.5, impl="ragged"))
  # Exact replay on MoE: the rollout records each token's expert ids and replay routes with
  # them (routing is a function of the hidden state; DESIGN §4, tunix's router replay).
  c.orl.capture_routes = True
  # LLaDA2.1 token editing is off in rollouts and evaluation by default; the presets are
  # (decode.threshold, decode.edit_threshold, decode.max_post_edit_steps): dllm 0.95 / 0.9 /
  # 16, SGLang 0.5 / 0.0 / 16 (LLaDA2.0 has no editing).
  _run_sizes(c)


def _llada_8b(c):
  """LLaDA-8B shapes (DESIGN §4)."""
  dlm_common.set_shapes(c, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                        mlp_dim=12288, vocab_size=126464, rope_theta=500000.0, norm_eps=1e-5,
                        qk_norm=False, tie_embeddings=False)
  _run_sizes(c)


def _run_sizes(c):
  """Prompt, response, rollout and replay sizes of the full-size LLaDA runs."""
  c.task.prompt_len = 512
  c.decode.gen_length = 256
  c.orl.prompts_per_step, c.orl.group_size = 8, 8
  c.orl.rollout_rule, c.orl.rollout_rule_value = "entropy_budget", 0.5
  c.replay.row_len, c.replay.n_rows = 4096, 16
  c.replay.max_states, c.replay.max_responses = 256, 64


def _debug(c):
  """A tiny random LLaDA2 MoE on the tiny task (2 ORL iterations on CPU)."""
  dlm_common.debug_overrides(c, block_size=8, workdir="work_dirs/llada_debug")
  m = c.model
  m.n_layers, m.first_k_dense = 4, 1
  m.moe.update(dict(n_experts=8, top_k=2, expert_dim=16, n_group=2, topk_group=1, n_shared=1,
                    impl="dense"))     # dense expert compute: the tiny-CPU path


def get_config(arg: str | None = None):
  arg = arg or "2.1-mini"
  if arg not in VARIANTS:
    raise ValueError(f"configs/llada.py has variants {', '.join(VARIANTS)}; got {arg!r}")
  if arg in ("2.1-mini", "2.0-mini", "debug"):
    c = dlm_common.real_base("llada2_moe", hub_id=f"inclusionAI/LLaDA{arg[:3]}-mini")
    _llada2_mini(c)
    c.workdir = f"work_dirs/llada{arg[:3]}_mini"
  else:
    c = dlm_common.real_base("llada", hub_id=f"GSAI-ML/LLaDA-8B-{arg[3:].capitalize()}")
    _llada_8b(c)
    c.workdir = "work_dirs/llada" if arg == "8b-instruct" else "work_dirs/llada_base"
  if arg == "8b-instruct":
    # the end of the assistant turn; the released config.json's eos_token_id is <|endoftext|>
    # (126081), the padding the model writes after <|eot_id|>
    c.model.special_tokens.eos = "<|eot_id|>"
  if arg == "8b-base":
    c.model.special_tokens.eos = "126081"
    c.task.chat = "none"
  if arg == "debug":
    _debug(c)
  return c
