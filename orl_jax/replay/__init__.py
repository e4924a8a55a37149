"""Replay (docs/method.md#replay-states-packing-staircase-attention): select captured states of
verified responses, plan their packing into staircase rows on the host (`plan.py`), gather the
packed batch on device (`gather.py`)."""
from orl_jax.replay.gather import abstract_batch, gather_batch
from orl_jax.replay.plan import (LAYOUTS, SRC_CLEAN, SRC_MASK, SRC_PAD, SRC_PROMPT, SRC_STATE,
                                 ReplayConfig, ReplayPlan, balance_rows, build_plan,
                                 order_rows_for_micro_batches, row_costs, select_states)
