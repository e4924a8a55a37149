"""The allowed values of config fields whose owners sit above `orl_jax.config` (the per-row
engine, the losses, the replay plan): kept here so that validating a config imports none of
those modules. Each owner imports its tuple from here."""
from __future__ import annotations

SCHEDULES = ("lockstep", "per_row")              # decode.schedule (orl_jax.decode.per_row)
KL_REFERENCES = ("initial", "rollout")           # loss.kl_reference (orl_jax.losses)
REPLAY_LAYOUTS = ("packed", "naive", "canvas")   # replay.layout (orl_jax.replay.plan)
