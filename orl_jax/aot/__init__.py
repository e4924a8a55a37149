"""Ahead-of-time compilation for the accelerators a run is meant for, on any host: targets
(TPU topologies, GPU nodes) as compile-only devices, the programs of an ORL iteration built on
them from abstract arguments, and what their compilers say (`launch/compile.py`)."""
