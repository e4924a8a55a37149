"""The embedded default: a ~1M-parameter block-diffusion LM on procedural arithmetic.

Launch lines:
  python launch/train.py --config=configs/tiny.py            # the full demo (base -> eval)
  python launch/train.py --config=configs/tiny.py:sft        # train the base model only
  python launch/train.py --config=configs/tiny.py:ablations  # ORL and ablations x 3 seeds
  python launch/eval.py  --config=configs/tiny.py:eval --config.model.init_from=PATH
  python launch/decode.py --config=configs/tiny.py:eval --config.model.init_from=PATH

Variants (`get_config(arg)`):
  ""/"demo" : SFT base model (reused from the committed `assets/tiny_base` or the work
              directory when present) then evaluation; writes results.json.
  "sft"     : masked-diffusion SFT of the base model from scratch (what `make base` runs).
  "eval"    : evaluation of `model.init_from` with the decoder settings in `eval.settings`.
  "smoke"   : a few steps of everything on small shapes (tests).
  "ablations": the demo with full ORL and every ablation (no_aec, no_kl, no_residual,
              no_warmup, rcd_offline), each over rollout seeds 0, 1, 2, at one
              shared budget of 150 updates (ABLATION_STEPS); results.json holds seed means
              and per-seed figures.
  "warmup"  : the residual warm-up alone, from the committed base (what `make warmup` runs).
  "orl", "no_aec", "no_kl", "kl_rollout", "no_warmup", "no_residual", "lr_scale_1",
  "rcd_offline"
            : one stage of the demo alone, starting from `model.init_from` (default: the
              committed warm-up for stages that start from it, else the committed base).
"""
import difflib

import ml_collections


STAGES = ("warmup", "orl", "no_aec", "no_kl", "kl_rollout", "no_residual", "no_warmup",
          "lr_scale_1", "rcd_offline")
# The `ablations` variant: full ORL and each ablation over rollout seeds
# (docs/method.md#the-losses, docs/method.md#the-on-policy-loop).
# Not `kl_rollout`: with one update per fresh rollout and exact replay its KL is zero, so it is
# `no_kl` (equal to the last digit in all three seeds of the 2026-12-01 study); it stays a stage.
ABLATIONS = ("no_aec", "no_kl", "no_residual", "no_warmup", "rcd_offline")
ABLATION_STEPS = 150
VARIANTS = ("demo", "sft", "eval", "smoke", "ablations") + STAGES


def unknown_variant(path: str, variants, arg) -> ValueError:
  """The error `get_config` raises for a variant its file does not have: one sentence with the
  closest variant and all of them, which the launchers print alone (launch/_common.py)."""
  close = difflib.get_close_matches(str(arg), variants, n=1)
  hint = f" (did you mean {close[0]!r}?)" if close else ""
  return ValueError(f"{path} has no variant {arg!r}{hint}; its variants are "
                    f"{', '.join(variants)}")


def _merge(a: dict, b: dict) -> dict:
  out = dict(a)
  for k, v in b.items():
    out[k] = _merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
  return out


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                        # init, data order, rollout noise (unless orl.rollout_seed)
  c.workdir = "work_dirs/tiny"      # checkpoints, metrics.jsonl, params/, results.json
  c.dry_run = False                 # True: print per-device memory (apps/dry_run.py) and exit
  c.pipeline = "train"            # "demo": base -> (orl) -> evaluation -> results.json

  c.model = ml_collections.ConfigDict()
  c.model.attention = "block_causal"  # layout: "block_causal" (KV cache) | "bidirectional"
  c.model.d_model = 128             # hidden size
  c.model.n_layers = 4              # transformer layers
  c.model.n_heads = 4               # query heads
  c.model.n_kv_heads = 2            # key/value heads (grouped-query attention)
  c.model.head_dim = 32             # width of one head
  c.model.mlp_dim = 384             # SwiGLU hidden width
  c.model.rope_theta = 10000.0      # RoPE base frequency
  c.model.rope_fraction = 1.0       # share of head_dim that RoPE rotates (LLaDA2: 0.5)
  c.model.norm_eps = 1e-6           # RMSNorm epsilon
  c.model.qk_norm = True            # RMSNorm on each query and key head (Qwen3, LLaDA2)
  c.model.tie_embeddings = False    # True: the head reuses the token embedding
  c.model.embed_scale = 1.0         # token embeddings (and the residual z) are multiplied by this
  c.model.dtype = "float32"         # compute dtype of activations
  c.model.param_dtype = "float32"   # storage dtype of parameters and AdamW moments
  c.model.attention_impl = "auto"   # auto | xla | pallas | splash (replay attention)
  c.model.remat = False             # recompute each layer in the backward pass (real models)
  # The weights to start from: a local Hugging Face model directory (config.json: the model
  # family and every architecture field then come from it) or an orl_jax params folder
  # (meta.json). "" = model.init_from, else a fresh init.
  c.model.path = ""
  c.model.init_from = ""          # older name for a params folder (the demo's stages set it)
  c.model.residual = ml_collections.ConfigDict()
  c.model.residual.mode = "none"    # residual pathway: none | adapter | rcd
  c.model.residual.hidden = 128     # width of the residual adapter
  c.model.residual.scale = 1.0      # multiplies the adapter output added to the input embedding
  c.model.residual.temperature = 1.0  # T_res: z = softmax(logits / T_res) @ E
  c.model.residual.lr_scale = 0.1   # adapter learning rate = train.lr x this (residual scaling)

  c.task = ml_collections.ConfigDict()
  c.task.name = "tiny"              # tiny | gsm8k | humaneval | jsonl (task.path)
  c.task.prompt_len = 32            # prompts are left-padded (or refused) to this many tokens
  # the tiny task's generator: each field is documented in data/tiny_task.py TinyTaskConfig
  c.task.tiny = ml_collections.ConfigDict(dict(min_ops=2, max_ops=3, max_operand=20,
                                               max_product_operand=5, max_value=99,
                                               fixed_width=True, commute_probability=0.3,
                                               n_eval=2048))
  # code tasks (humaneval, jsonl): the sandboxed verifier (docs/verifier.md)
  c.task.verify_workers = 0         # samples verified at once; 0 = the host's usable cores
  c.task.verify_cpu_s = 3           # a sample's CPU seconds (wall timeout 10 s)
  # a problem with a reference solution: max(floor, factor x its measured CPU s) instead
  c.task.verify_time_factor = 4.0   # EvalPlus's factor; 0: every problem gets verify_cpu_s
  c.task.verify_time_floor_s = 1.0  # the fewest CPU seconds such a problem's samples get
  # "sample": a prompt's samples verified side by side; "prompt": never two at once, in slots
  c.task.verify_isolation = "sample"  # (docs/verifier.md#threat-model: what each leaves open)

  c.decode = ml_collections.ConfigDict()
  c.decode.block_size = 32          # b: tokens decoded together in one block
  c.decode.gen_length = 32          # N: response tokens (a multiple of block_size)
  c.decode.rule = "threshold"       # threshold | entropy_budget | fixed_steps
  c.decode.rule_value = 0.9         # the rule's parameter
  c.decode.temperature = 0.0        # 0 = greedy; > 0 = sampling at this temperature
  c.decode.max_steps_per_block = 0  # safety bound on steps per block (0 = block_size)
  c.decode.top_k = 16               # rollout capture: top-K ids and log-probs kept per position
  # LLaDA2.1 token editing (docs/models.md#llada21-token-editing): a step also rewrites committed
  # tokens of the block whose new candidate differs with probability > edit_threshold, and a filled
  # block takes up to max_post_edit_steps more steps (until one edits nothing); every step counts in
  # TPF and is a captured rollout state. 1.0 / 0 = off. Presets as (rule_value, edit_threshold,
  # max_post_edit_steps): dllm 0.95 / 0.9 / 16, SGLang 0.5 / 0.0 / 16.
  c.decode.edit_threshold = 1.0
  c.decode.max_post_edit_steps = 0  # LLaDA2.1 editing steps after a block fills
  # Bidirectional families (model.attention="bidirectional"; others must keep "none": they decode
  # through an exact KV cache): "none" forwards the whole canvas every step (exact); Fast-dLLM's
  # approximate caches forward the whole canvas once per block start, then only the block and
  # what follows it ("prefix") or only the block ("dual") against the stored K/V. ORL
  # rollouts (train.mode="orl") need "none": their states must replay exactly.
  c.decode.cache = "none"
  # lockstep: a batch shares its block index (every block waits for its slowest row);
  # per_row: each row advances through its own blocks and a finished row takes the next prompt
  # (continuous batching, orl_jax/decode/per_row.py) in evaluation and rollouts
  c.decode.schedule = "lockstep"
  # The authors' rules of the model's family (docs/decoding.md#decoding-as-each-models-authors-do;
  # "auto" = the weights' family's, from its registry entry, our tiny model's for a model of ours):
  #   block_placement  prompt_end (the first block starts at the prompt's end: LLaDA-8B,
  #                    tiny) | absolute (blocks at multiples of b from the first prompt token,
  #                    the prompt's last block shared with the first generated tokens: LLaDA2.x,
  #                    SDAR, QwenDLM)
  #   commit_compare   ">=" (threshold rule conf >= tau: Fast-dLLM, tiny) | ">" (LLaDA2.x, SDAR)
  c.decode.block_placement = "auto"  # auto | prompt_end | absolute
  c.decode.commit_compare = "auto"   # auto | ">=" | ">"
  # A row stops after the block in which it committed EOS (True); False decodes every block,
  # as LLaDA2.1's and Fast-dLLM's `generate` do by default (the response is cut at its first
  # EOS either way; only the forwards spent differ). ORL rollouts always stop.
  c.decode.eos_early_stop = True

  c.train = ml_collections.ConfigDict()
  c.train.mode = "sft"              # sft | residual_warmup | rcd_offline | orl | eval
  c.train.steps = 4000              # optimizer updates (ORL: iterations)
  c.train.batch_size = 64           # SFT / warm-up rows per update
  c.train.lr = 2e-3                 # peak AdamW learning rate
  c.train.warmup_steps = 200        # linear learning-rate warm-up, in updates
  c.train.final_lr_fraction = 0.05  # cosine decay ends at this share of train.lr
  c.train.b1 = 0.9                  # AdamW beta1
  c.train.b2 = 0.98                 # AdamW beta2
  c.train.weight_decay = 0.01       # AdamW decoupled weight decay
  c.train.grad_clip = 1.0           # global-norm gradient clipping (0 = off)
  c.train.freeze_base = False       # True: only the residual adapter trains
  c.train.log_every = 50            # updates between log lines and metrics.jsonl records
  # Order of the training problems (SFT rows, ORL prompts): -1 = the stream's own order,
  # k >= 0 = a permutation seeded by k (the demo's seeds set it, so seeds differ in data order)
  c.train.shuffle_seed = -1
  # residual_warmup: share of rows whose second pass consumes the model's own first-pass z
  c.train.self_condition_probability = 0.5

  # ORL (docs/method.md#the-algorithm-as-the-code-runs-it). Used when train.mode == "orl".
  c.orl = ml_collections.ConfigDict()
  c.orl.prompts_per_step = 8        # P
  c.orl.group_size = 8              # G rollouts per prompt
  c.orl.rollout_temperature = 1.0   # sampling temperature of the rollouts
  c.orl.rollout_rule = "threshold"  # the decoder the rollouts (and so the training states) use
  c.orl.rollout_rule_value = 0.9    # the rollout rule's parameter
  c.orl.min_reward = 1.0            # responses scoring >= this produce gradient (verified)
  c.orl.capture_states = 0          # 0 = n_blocks * max steps per block (every step fits)
  c.orl.rollout_seed = -1           # seed of the rollout sampling noise (-1 = `seed`)
  # decode.schedule="per_row": rows the engine decodes the P*G rollout responses on, a row
  # whose response ended taking the next one (continuous batching); 0 = P*G, one per response
  c.orl.rollout_rows = 0
  # MoE models: record every forward's expert ids during the rollout (its steps, the prompt
  # prefill, the commit forwards) and replay with them, so a near-tie in a router cannot send a
  # replayed token to other experts than the rollout's (block-causal families and
  # DiffusionGemma; not the bidirectional LLaDA-8B)
  c.orl.capture_routes = False
  # The iteration's prompts are rolled out as this many chunks of P / rollout_chunks prompts
  # (docs/training.md#verification-overlapped-with-decoding); 1 = one rollout, as ever
  c.orl.rollout_chunks = 1
  # decode.schedule="lockstep", block-causal models: run each prompt's forward once for its G
  # responses, not once per response (docs/method.md#the-prompt-is-prefilled-once: the same
  # tokens; captured floats may differ in the last bits where XLA's kernels depend on the batch)
  c.orl.prefill_once = False
  # what a chunk holds: "samples" = every prompt, group_size / rollout_chunks responses each
  # (a prompt's samples are verified one after another, so this spreads them over the chunks);
  # "prompts" = prompts_per_step / rollout_chunks prompts, group_size responses each
  c.orl.chunk_by = "samples"
  # with rollout_chunks > 1: verify chunk i on the host while the device decodes the later
  # chunks (False: decode all, then verify; the same programs, keys and results)
  c.orl.verify_while_decoding = True
  # per-row rollouts (decode.schedule="per_row") with verify_while_decoding: the engine runs in
  # segments of this many loop iterations and the host verifies the responses whose rows retired
  # after each (the same rollout, bit for bit); 0 = one program, verified when it ends
  c.orl.rollout_segment_iterations = 16
  # policy lag (docs/training.md#one-step-of-lag): 0 = every rollout is drawn with the parameters
  # it updates; 1 = the next iteration's rollout is dispatched before this one's verification and
  # update (the device decodes while the host verifies), so each update replays states drawn one
  # update earlier
  c.orl.max_staleness = 0

  c.replay = ml_collections.ConfigDict()
  c.replay.row_len = 544           # a prompt (32) + 16 states of 32
  c.replay.n_rows = 16              # R: rows per update (divisible by the batch shards)
  c.replay.max_states = 320         # selected-state slots per update
  c.replay.max_responses = 64       # response slots per update
  c.replay.states_per_response = 4  # our choice for the 2-core budget (0 = every state)
  c.replay.layout = "packed"        # packed (staircase rows) | naive (a state a row) | canvas
  c.replay.micro_batches = 1        # gradient accumulation over row micro-batches (one update)

  c.loss = ml_collections.ConfigDict()
  # CE only where the rollout was uncertain (normalized entropy >= this). Measured on the tiny
  # task (README, 300 updates, 2048 problems, threshold 0.9): 0 -> 0.946 / 2.05x, 0.05 ->
  # 0.950 / 2.03x, 0.1 -> 0.954 / 1.93x; 0.05 keeps the base's accuracy at the same speed-up.
  c.loss.gate_entropy = 0.05
  c.loss.aec_rho = 0.25             # AEC: required relative entropy contraction per step
  c.loss.conf_entropy = 0.1         # tau_conf: anchor where ref. normalized H < this
  c.loss.kl_cap = 1.0               # c: per-position cap of the reverse KL
  c.loss.w_aec = 1.0                # weight of the AEC term (0 = off)
  c.loss.w_kl = 1.0                 # weight of the KL anchor (0 = off: no reference forward)
  c.loss.vocab_chunk = 0          # tokens per chunk of the head statistics (0 = off)
  # the anchor's reference: "initial" = the frozen model ORL starts from (one more forward and
  # one more copy of the weights); "rollout" = the rollout's own top-K (an ablation: zero
  # under one update per fresh rollout)
  c.loss.kl_reference = "initial"
  # True: log the gradient norms of CE, AEC and the anchor separately per update
  # (`grad_norm_ce`, `grad_norm_aec`, `grad_norm_anchor`; docs/method.md#metrics): a second
  # forward and one backward per term, off by default for their cost; not with micro_batches > 1
  c.loss.term_grad_norms = False

  c.eval = ml_collections.ConfigDict()
  # 2048 problems: a standard error of about 0.5 point on accuracies near 0.95 (512 gave about
  # 1 point, the size of the demo's accuracy bar; the base measured 0.963 on the first 512 and
  # 0.948 on 2048). `fixed_steps_1` (one token per forward: 33 forwards) is left out of the demo
  # for time; `:eval` and `eval.settings` still take it.
  c.eval.n_problems = 2048          # the first problems of the evaluation set scored (0 = all)
  c.eval.batch_size = 256           # problems decoded together (divisible by the batch shards)
  # decoder settings, "<rule>_<value>"
  c.eval.settings = ("threshold_0.9", "threshold_0.7", "entropy_budget_0.5")
  c.eval.name = ""                # the model's key in results.json ("" = the run's name)
  c.eval.compare = ""             # "DIR:name,DIR:name": models evaluated side by side
  c.eval.random_init = False        # True: evaluate a fresh init (no weights)

  c.serve = ml_collections.ConfigDict()   # launch/serve.py (docs/serving.md)
  c.serve.rows = 16                 # engine rows decoding at once (divisible by the batch shards)
  c.serve.iterations_per_call = 8   # engine iterations per device call (the host acts between)
  c.serve.waiting_slots = 0         # requests waiting on the device for a row, refilling rows
                                    # inside a call (0 = 3 x serve.rows)
  c.serve.prompt_pool = 16          # prompt caches the n choices of a request share (0 = off)
  c.serve.max_waiting = 256         # choices waiting for the engine before a 429
  c.serve.model_name = ""           # the model's name in the API ("" = the weights' folder name)
  c.serve.watch = ""                # a run's work directory (or params folder): serve its newest
                                    # weights as they land
  c.serve.watch_seconds = 10.0      # how often `watch` is looked at
  c.serve.max_body_bytes = 1 << 20  # a request body past this is a 413
  # seconds a client may take to send its request head, between two parts of its body (then a
  # 408), and idle on a kept-alive connection; a connection past one is closed
  c.serve.header_timeout = 10.0     # the request line and headers (nginx: 60, uvicorn: none)
  c.serve.body_timeout = 30.0       # between two parts of a body (a 408)
  c.serve.idle_timeout = 5.0        # a kept-alive connection between requests (uvicorn's 5)
  c.serve.drain_timeout = 30.0      # SIGTERM: the requests in flight get this long, then exit
  # keys (comma-separated; also --api-key / --admin-key and ORL_API_KEYS / ORL_ADMIN_KEYS):
  # every /v1/* route takes an API key once one is set; /v1/admin/* is off without an admin
  # key, and reloads only read folders under reload_root
  c.serve.api_keys = ""             # "" = /v1/* open
  c.serve.admin_keys = ""           # "" = /v1/admin/* off
  c.serve.reload_root = ""          # "" = no reloads
  c.serve.key_probes = False        # True: /health and /metrics take an API key too

  c.checkpoint = ml_collections.ConfigDict()
  # updates between checkpoints; the last step's is always saved, and so is the step a run
  # stopped by SIGINT/SIGTERM ends at (0: only those two; docs/training.md, Interrupts)
  c.checkpoint.every = 500
  c.checkpoint.keep = 2             # checkpoints kept
  # True: snapshot each rollout (a kill between rollout and update resumes it)
  c.checkpoint.save_rollouts = False
  # Each checkpoint records the settings that decide the run's rollouts, replay and loss
  # (orl_jax/setup/recorded.py); a resume under other values stops, naming them. The
  # fields (separated by commas) a resume may find changed, e.g. "orl.rollout_rule_value,loss.w_kl"
  c.checkpoint.allow_changed = ""

  # Axis sizes (one of data/fsdp/tensor may be -1: the rest of the devices). `expert` splits
  # the routed experts of MoE models and, with data and fsdp, the batch (orl_jax/sharding.py).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
  # Ways of each axis that cross the data-center network between TPU slices (or hosts, where
  # devices have no slice index); all 1 = a plain mesh. E.g. 2 slices of data parallelism:
  # --config.mesh.data=2 --config.mesh.fsdp=-1 --config.mesh.dcn.data=2
  c.mesh.dcn = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  # Multi-host start-up (orl_jax/distributed.py): auto-detects SLURM / TPU pods / coordinator
  # variables; "on" with coordinator, num_processes, process_id for an explicit job.
  c.distributed = ml_collections.ConfigDict(dict(mode="auto", coordinator="", num_processes=0,
                                                 process_id=-1))

  # The demo pipeline's own settings (orl_jax/apps/demo.py): `demo.stages`, each a set of
  # overrides merged into this config (`config.update`), started from the model
  # `demo.stage_start` names: "base" (the SFT base model) or "warmup" (the base after the
  # residual warm-up stage, docs/method.md#the-residual-pathway; trained once and shared). The
  # demo runs base -> warmup -> "orl" (+ "rcd_offline" with compare_offline, + each of
  # `ablations`); `--config=configs/tiny.py:STAGE` runs one stage alone from `model.init_from`.
  c.demo = ml_collections.ConfigDict()
  c.demo.compare_offline = False  # also train "rcd_offline" (offline RCD, the same budget)
  c.demo.ablations = ()             # e.g. ("no_aec", "no_kl", "no_residual"); see ABLATIONS
  # Residual warm-up: masked-diffusion training where half the rows consume the model's own
  # first-pass prediction through the adapter (self-conditioning); the adapter (zero-initialised
  # output) learns at the full learning rate here, so the pathway carries signal when ORL starts.
  warmup = dict(train=dict(mode="residual_warmup", steps=400, lr=3e-4, warmup_steps=40,
                           final_lr_fraction=0.1, log_every=20),
                model=dict(residual=dict(mode="adapter", lr_scale=1.0)),
                checkpoint=dict(every=200), eval=dict(name="warmup"))
  # The demo's single ORL run reads the problems in order (train.shuffle_seed -1, the committed
  # table); each seed of the `ablations` variant reads them in its own order.
  orl_train = dict(mode="orl", steps=300, lr=5e-5, warmup_steps=20, final_lr_fraction=0.1,
                   log_every=5)
  orl = dict(train=orl_train, model=dict(residual=dict(mode="adapter")),
             checkpoint=dict(every=50), eval=dict(name="orl"))
  c.demo.stages = ml_collections.ConfigDict(dict(
      warmup=warmup,
      orl=orl,
      no_aec=_merge(orl, dict(loss=dict(w_aec=0.0), eval=dict(name="orl_no_aec"))),
      no_kl=_merge(orl, dict(loss=dict(w_kl=0.0), eval=dict(name="orl_no_kl"))),
      kl_rollout=_merge(orl, dict(loss=dict(kl_reference="rollout"),
                                  eval=dict(name="orl_kl_rollout"))),
      # no pathway at all: no adapter, no warm-up (starts from the base)
      no_residual=_merge(orl, dict(model=dict(residual=dict(mode="none")),
                                   eval=dict(name="orl_no_residual"))),
      # the pathway without the warm-up: a zero-output adapter trained by ORL alone
      no_warmup=_merge(orl, dict(eval=dict(name="orl_no_warmup"))),
      # residual scaling isolated: the adapter at the full learning rate (lr_scale 1 vs 0.1)
      lr_scale_1=_merge(orl, dict(model=dict(residual=dict(lr_scale=1.0)),
                                  eval=dict(name="orl_lr_scale_1"))),
      # Offline RCD with the same optimizer budget: as many SFT-layout steps as ORL updates.
      rcd_offline=dict(train=dict(mode="rcd_offline", steps=300, lr=5e-5, warmup_steps=20,
                                  final_lr_fraction=0.1, log_every=5),
                       model=dict(residual=dict(mode="rcd")), checkpoint=dict(every=50),
                       eval=dict(name="rcd_offline")),
  ))
  c.demo.stage_start = ml_collections.ConfigDict(dict(
      warmup="base", orl="warmup", no_aec="warmup", no_kl="warmup", kl_rollout="warmup",
      no_residual="base", no_warmup="base", lr_scale_1="warmup", rcd_offline="base"))
  c.demo.base_checkpoint = "assets/tiny_base"   # committed base model (`make base` makes it)
  # committed residual warm-up of that base (`make warmup` reproduces it; "" = train it)
  c.demo.warmup_checkpoint = "assets/tiny_warmup"
  # seeds of every ORL stage (() = `seed` only); a seed sets the rollout noise and the order of
  # the ORL prompts (train.shuffle_seed)
  c.demo.seeds = ()
  # >= 0 retrains the warm-up with this seed and runs every stage that starts from the warm-up
  # once more from it (results key `<name>@warmup<k>`, beside the seed means)
  c.demo.warmup_seed = -1
  return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = base_config()
  arg = arg or "demo"
  if arg == "demo":
    c.pipeline = "demo"
    c.workdir = "work_dirs/tiny_demo"
  elif arg == "sft":
    c.train.mode = "sft"
    c.workdir = "work_dirs/tiny_sft"
  elif arg == "ablations":
    c.pipeline = "demo"
    c.workdir = "work_dirs/tiny_ablations"
    c.demo.ablations = ABLATIONS
    c.demo.seeds = (0, 1, 2)
    c.demo.warmup_seed = 3
    # One shared budget for every run of the study: 150 updates (the demo's ORL runs 300). The
    # rollout TPF of the demo's ORL run is within 10% of its final value by update 100-150, and
    # 21 runs of 300 updates do not fit a working day on 2 CPU cores.
    for stage in ("orl",) + ABLATIONS:
      c.demo.stages[stage].train.steps = ABLATION_STEPS
  elif arg in STAGES:
    c.update(c.demo.stages[arg].to_dict())
    start = c.demo.stage_start[arg]
    c.model.init_from = c.demo.base_checkpoint if start == "base" else c.demo.warmup_checkpoint
    c.workdir = f"work_dirs/tiny_{arg}"
  elif arg == "eval":
    c.train.mode = "eval"
    c.workdir = "work_dirs/tiny_eval"
  elif arg == "smoke":
    c.workdir = "work_dirs/tiny_smoke"
    c.model.d_model, c.model.n_layers, c.model.mlp_dim, c.model.head_dim = 32, 2, 64, 8
    c.decode.block_size = 8
    c.task.prompt_len = 32
    c.train.steps, c.train.batch_size, c.train.warmup_steps, c.train.log_every = 4, 8, 2, 2
    c.checkpoint.every = 2
    c.eval.n_problems, c.eval.batch_size = 8, 8
    c.eval.settings = ("fixed_steps_1", "threshold_0.9")
  else:
    raise unknown_variant("configs/tiny.py", VARIANTS, arg)
  return c
