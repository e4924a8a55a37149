"""DiffusionGemma: uniform-noise block diffusion whose self-conditioning block is ORL's
residual pathway (docs/models.md#diffusiongemma; registry family `diffusion_gemma`).

Launch lines:
  python launch/train.py --config=configs/diffusion_gemma.py:26b-a4b \
      --config.model.path=/path/diffusiongemma-26B-A4B-it --config.task.path=my_train.jsonl
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/train.py \
      --config=configs/diffusion_gemma.py:26b-a4b --config.dry_run=True
                                              # per-device memory, fsdp=1 x expert=8 (8 devices)
  python launch/train.py --config=configs/diffusion_gemma.py:26b-a4b --config.dry_run=True \
      --config.mesh.fsdp=8                    # fsdp=8 x expert=8 (64 devices), sized on one CPU
  python launch/train.py --config=configs/diffusion_gemma.py:debug --config.train.steps=2
                                              # tiny random model, 2 ORL iterations (CPU)
  python launch/eval.py --config=configs/diffusion_gemma.py:debug --config.eval.compare=random:base
                                              # accuracy vs TPF (both counts) -> results.json

With `model.path` a Hugging Face directory, its config.json decides every shape (the values
below are for sizing and random-init runs); the run exports WORKDIR/hf, which transformers'
`DiffusionGemmaForBlockDiffusion` loads (the vision tower of `model.path` is carried through).
launch/decode.py, evaluation and ORL rollouts decode it with the family's own uniform-noise
sampler (`orl_jax.models.diffusion_gemma.sampler`; `sampler.generate` from Python).

Model fields beyond the shared ones (configs/dlm_common.py):
  model.diffusion_gemma.sliding_window        window of the sliding layers (1024 in the release)
  model.diffusion_gemma.global_head_dim       head_dim of the full-attention layers (K = V)
  model.diffusion_gemma.n_global_kv_heads     kv heads of the full-attention layers
  model.diffusion_gemma.full_every            every n-th layer (and the last) is full attention
  model.diffusion_gemma.global_rope_theta / global_rope_fraction   proportional RoPE of full
                                              layers (sliding layers: model.rope_theta)
Decoding (transformers' EntropyBoundSampler): decode.block_size is the canvas length,
decode.gen_length the response length (whole canvases), decode.rule_value the entropy bound
(nats), decode.max_steps_per_block the denoising steps per canvas, decode.t_max -> decode.t_min
the linear temperature schedule, and a canvas stops when its argmax is stable for
decode.stability_threshold steps with mean entropy below decode.confidence_threshold; these
are unset here, so a run reads them from model.path's generation_config.json, else takes
transformers' defaults (256 tokens, 0.1, 48, 0.8 -> 0.4, 1, 0.005). Generation stops once every
row has ended (EOS): no further canvas is generated. Rollouts record every forward's MoE expert ids
(`orl.capture_routes`, on) so replay routes each token as the rollout did. Evaluation
(`launch/eval.py`) decodes with the same sampler; its settings are `entropy_budget_<nats>`.

Variants (`get_config(arg)`):
  "26b-a4b" (default): google/diffusiongemma-26B-A4B-it shapes: 30 layers (full on 5, 11, 17,
            23, 29), hidden 2816, 16 heads, MoE 128 experts top-8 (704 wide) beside a dense
            2112 MLP in every layer, vocab 262144, window 1024, canvases of 256; experts over
            the `expert` mesh axis (8 ways); 256 new tokens (one canvas) unless
            generation_config.json or decode.gen_length says otherwise.
  "debug"   : a tiny random DiffusionGemma (2 layers sliding + full, 4 experts top-2) on the
            tiny task: 2 ORL iterations on CPU.
"""
import ml_collections
from ml_collections.config_dict import placeholder

from configs import dlm_common, tiny

VARIANTS = ("26b-a4b", "debug")


def _release(c):
  dlm_common.set_shapes(c, d_model=2816, n_layers=30, n_heads=16, n_kv_heads=8, head_dim=256,
                        mlp_dim=2112, vocab_size=262144, rope_theta=1e4, norm_eps=1e-6,
                        qk_norm=True, tie_embeddings=True)
  c.model.diffusion_gemma = ml_collections.ConfigDict(dict(
      sliding_window=1024, global_head_dim=512, n_global_kv_heads=2, full_every=6,
      global_rope_theta=1e6, global_rope_fraction=0.25))
  c.model.moe.update(dict(n_experts=128, top_k=8, expert_dim=704, impl="ragged"))
  # The sampler's settings are left unset: a run takes them from model.path's
  # generation_config.json, else transformers' defaults (gen_length 256 = one canvas, 48 steps,
  # entropy bound 0.1, t 0.8 -> 0.4, stability 1, confidence 0.005); set one to override it.
  d = c.decode
  d.gen_length = placeholder(int)
  d.max_steps_per_block = placeholder(int)
  d.rule_value = placeholder(float)
  d.t_min, d.t_max = placeholder(float), placeholder(float)
  d.stability_threshold, d.confidence_threshold = placeholder(int), placeholder(float)
  c.task.prompt_len = 512
  c.orl.prompts_per_step, c.orl.group_size = 8, 8
  c.orl.rollout_rule, c.orl.rollout_rule_value = "entropy_budget", 0.1
  c.orl.rollout_temperature = 1.0        # the sampler's own schedule (t_max -> t_min) applies
  c.orl.capture_routes = True            # record every forward's expert ids: exact MoE replay
  # a state is a whole canvas (256): prompt + committed canvases + a few states per row
  c.replay.row_len, c.replay.n_rows = 4096, 16
  c.replay.max_states, c.replay.max_responses = 128, 64
  c.replay.states_per_response = 8
  # evaluation: the sampler's entropy bound in nats (transformers' default 0.1)
  c.eval.settings = ("entropy_budget_0.1", "entropy_budget_0.5", "entropy_budget_1.0")
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor, c.mesh.expert = 1, -1, 1, 8


def _debug(c):
  dlm_common.debug_overrides(c, block_size=16, workdir="work_dirs/diffusion_gemma_debug")
  m = c.model
  m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.mlp_dim = 2, 2, 2, 16, 32
  m.diffusion_gemma.update(dict(sliding_window=8, global_head_dim=16, n_global_kv_heads=1))
  m.moe.update(dict(n_experts=4, top_k=2, expert_dim=8, impl="dense"))
  c.decode.gen_length = 32               # two canvases of 16
  c.decode.max_steps_per_block = 6
  c.orl.rollout_rule, c.orl.rollout_rule_value = "entropy_budget", 0.1
  c.replay.row_len, c.replay.n_rows, c.replay.max_states, c.replay.max_responses = 256, 6, 24, 6
  c.replay.states_per_response = 4
  c.loss.conf_entropy = 0.999          # the random model's entropies sit near 0.9986
  c.eval.settings = ("entropy_budget_0.1", "entropy_budget_0.5")
  c.mesh.expert = 1


def get_config(arg: str | None = None):
  arg = arg or "26b-a4b"
  if arg not in VARIANTS:
    raise tiny.unknown_variant("configs/diffusion_gemma.py", VARIANTS, arg)
  c = dlm_common.real_base("diffusion_gemma", hub_id="google/diffusiongemma-26B-A4B-it")
  c.workdir = "work_dirs/diffusion_gemma"
  _release(c)
  if arg == "debug":
    _debug(c)
  return c
