"""LLaDA: LLaDA2.x-mini (MoE, block diffusion; the paper's LLaDA) and LLaDA-8B (dense,
bidirectional; docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm). The model facts come from the
family registry (`orl_jax.models.families`: `llada2_moe`, `llada`).

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
  python launch/train.py --config=configs/llada.py:debug-jsonl # the same on a JSONL file
  python launch/eval.py --config=configs/llada.py:debug-jsonl \
      --config.model.path=work_dirs/llada_debug_jsonl         # ... evaluated on the whole file
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

Variants (`get_config(arg)`); how each LLaDA2.x variant decodes, against the official
`generate` of its release (LLaDA2.1: block 32, steps 32, greedy, threshold 0.95, token editing
at 0.9 with up to 16 post-fill steps, every block decoded; LLaDA2.0: the same without editing,
stopping after the block holding EOS):
  "2.1-mini" (default): inclusionAI/LLaDA2.1-mini, 16B total / ~1.4B active, block-causal.
              Decodes as the official 2.1 `generate` with its defaults EXCEPT token editing,
              which is off (decode.edit_threshold 1.0, max_post_edit_steps 0): ORL rollouts
              take the editing setting too, where editing would add up to 16 forwards and
              captured states per block (the sizes in docs/scaling.md are for no editing).
              "2.1-mini-dllm" is the official default.
  "2.1-mini-dllm": LLaDA2.1-mini decoded exactly as the official 2.1 `generate` defaults (and
              dllm's LLaDA21Sampler, which mirrors it): "2.1-mini" with editing 0.9 / 16 steps.
  "2.1-mini-sglang": LLaDA2.1-mini as SGLang serves it: threshold 0.5, editing 0.0 / 16 steps,
              a row stops after the block holding its EOS (`PRESETS`).
  "2.0-mini"  : inclusionAI/LLaDA2.0-mini, same architecture, decoded as the official 2.0
              `generate` (threshold 0.95, block 32, stops after the block holding EOS).
  All of them decode `decode.gen_length` = 256 new tokens (a run size; the official default
  is 2048).
  "8b-instruct": GSAI-ML/LLaDA-8B-Instruct, chat template 'llada', EOS = <|eot_id|> (126348).
  "8b-base"   : GSAI-ML/LLaDA-8B-Base, no chat template, EOS = <|endoftext|> (126081).
  "debug"     : a tiny random LLaDA2 MoE (4 layers, 1 dense, 8 experts top-2, 1 shared, 2 groups
              keep 1) on the tiny task: 2 ORL iterations on CPU.
  "debug-jsonl": the same model on a JSONL file (task.path, default the shipped
              examples/math_and_code.jsonl) with the byte-level debug tokenizer: 4 ORL
              iterations, then launch/eval.py scores the whole file (a minute or two on CPU).
"""
from configs import dlm_common, tiny

VARIANTS = ("2.1-mini", "2.1-mini-dllm", "2.1-mini-sglang", "2.0-mini", "8b-instruct", "8b-base",
            "debug", "debug-jsonl")


def _llada2_mini(c):
  """LLaDA2.x-mini shapes (docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm)."""
  dlm_common.set_shapes(c, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, head_dim=128,
                        mlp_dim=5120, vocab_size=157184, rope_theta=6e5, norm_eps=1e-6,
                        qk_norm=True, tie_embeddings=False)
  m = c.model
  m.rope_fraction = 0.5            # partial_rotary_factor: rotate_half on the first 64 dims
  m.first_k_dense = 1
  m.norm_head = False
  # Groups are scored by their top-2 experts and 4 are kept; the number of groups, 8, is
  # our reading of the released config.json, which decides whenever model.path is given.
  m.moe.update(dict(n_experts=256, top_k=8, expert_dim=512, n_group=8, topk_group=4,
                    n_shared=1, routed_scaling_factor=2.5, impl="ragged"))
  # Exact replay on MoE: the rollout records each token's expert ids and replay routes with
  # them (routing is a function of the hidden state; docs/models.md#moe-llada2x-mini, tunix's router
  # replay).
  c.orl.capture_routes = True
  # LLaDA2.1 token editing is off in "2.1-mini" (rollouts and evaluation), unlike the official
  # `generate` default; `preset(c, name)` sets dllm's decoder (the official default) or
  # SGLang's (LLaDA2.0 has no editing).
  # The official 2.1 `generate` decodes every block (eos_early_stop=False, its default); the
  # 2.0 one always stops after the block holding EOS (get_config sets that for "2.0-mini").
  c.decode.eos_early_stop = False
  _run_sizes(c)


def _llada_8b(c):
  """LLaDA-8B shapes (docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm)."""
  dlm_common.set_shapes(c, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                        mlp_dim=12288, vocab_size=126464, rope_theta=500000.0, norm_eps=1e-5,
                        qk_norm=False, tie_embeddings=False)
  c.decode.eos_early_stop = False   # Fast-dLLM's `generate` decodes every block
  _run_sizes(c)


# LLaDA2.1's serving presets: (decode.rule_value, decode.edit_threshold,
# decode.max_post_edit_steps, decode.eos_early_stop). dllm's LLaDA21Sampler has the official
# `generate`'s defaults (threshold 0.95, editing_threshold 0.9, max_post_steps 16,
# eos_early_stop False); SGLang's scheduler finishes a request once a decoded block holds EOS.
PRESETS = {"dllm": (0.95, 0.9, 16, False), "sglang": (0.5, 0.0, 16, True)}


def preset(c, name: str):
  """Sets LLaDA2.1 decoding as the serving stack `name` (PRESETS) does: threshold rule,
  token editing, editing steps, and whether a row stops after its EOS block."""
  if name not in PRESETS:
    raise ValueError(f"configs/llada.py has decoding presets {tuple(PRESETS)}; got {name!r}")
  d = c.decode
  d.rule = "threshold"
  d.rule_value, d.edit_threshold, d.max_post_edit_steps, d.eos_early_stop = PRESETS[name]
  return c


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


def _debug_jsonl(c):
  """`debug` on a JSONL file of your own (default: the shipped examples/math_and_code.jsonl):
  the byte-level debug tokenizer, prompts of up to 160 tokens, 4 ORL iterations, then
  `launch/eval.py` scores the whole file (eval.n_problems = 0)."""
  _debug(c)
  c.task.name, c.task.path, c.task.prompt_len = "jsonl", "examples/math_and_code.jsonl", 160
  c.decode.gen_length = 32
  c.replay.row_len = 512
  c.train.steps = 4
  c.eval.n_problems, c.eval.batch_size = 0, 36
  c.eval.settings = ("threshold_0.9",)
  c.workdir = "work_dirs/llada_debug_jsonl"


def get_config(arg: str | None = None):
  arg = arg or "2.1-mini"
  if arg not in VARIANTS:
    raise tiny.unknown_variant("configs/llada.py", VARIANTS, arg)
  serving = arg.partition("-mini-")[2]          # a serving preset: "dllm" | "sglang" | ""
  if arg.startswith(("2.1-mini", "2.0-mini", "debug")):
    c = dlm_common.real_base("llada2_moe", hub_id=f"inclusionAI/LLaDA{arg[:3]}-mini")
    _llada2_mini(c)
    c.workdir = f"work_dirs/llada{arg[:3]}_mini"
  else:
    c = dlm_common.real_base("llada", hub_id=f"GSAI-ML/LLaDA-8B-{arg[3:].capitalize()}")
    _llada_8b(c)
    c.workdir = "work_dirs/llada" if arg == "8b-instruct" else "work_dirs/llada_base"
  if serving:
    preset(c, serving)
    c.workdir += f"_{serving}"
  if arg == "2.0-mini":
    c.decode.eos_early_stop = True   # the 2.0 `generate` stops after the block holding EOS
  if arg == "8b-instruct":
    # the end of the assistant turn; the released config.json's eos_token_id is <|endoftext|>
    # (126081), the padding the model writes after <|eot_id|>
    c.model.special_tokens.eos = "<|eot_id|>"
  if arg == "8b-base":
    c.model.special_tokens.eos = "126081"
    c.task.chat = "none"
  if arg == "debug":
    _debug(c)
  if arg == "debug-jsonl":
    _debug_jsonl(c)
  return c
