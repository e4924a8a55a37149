"""Small helpers several families' config.json readers share."""
from __future__ import annotations


def rope_theta(hf: dict, default: float) -> float:
  """`rope_theta` at the top level or inside `rope_parameters` / `rope_scaling`."""
  params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  return float(hf.get("rope_theta", params.get("rope_theta", default)))
