"""Attention kernels for orl_jax (staircase-masked attention for packed replay)."""
