"""Staircase attention for packed ORL replay rows
(docs/method.md#replay-states-packing-staircase-attention,
docs/scaling.md#attention-kernels-and-accelerators)."""
from pallas_kernels.staircase_attention.dispatch import (IMPLS, KERNELS, attention,
                                                         current_platform, target_platform)
from pallas_kernels.staircase_attention.meta import (KIND_CLEAN, KIND_PAD, KIND_PROMPT,
                                                     KIND_STATE, TokenMeta, make_meta,
                                                     staircase_visible)
from pallas_kernels.staircase_attention.reference import (masked_attention,
                                                          staircase_attention_reference)
from pallas_kernels.staircase_attention.tile_map import TileMap, build_tile_map
