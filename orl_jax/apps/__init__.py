"""The applications built on the library: the embedded demo (`demo`), the tiny base model's
pipeline (`base_model`), the sizing dry run (`dry_run`) and what runs report to their users
(`summary`, `plots`, `trajectory_view`). The launchers (`launch/`) call them; nothing in the
library imports them (`tests/project/test_architecture.py`).
"""
