"""Rows from records: what launch/train.py trains on, built from trajectory records and the attribution's hints
in the one row format of porch_jax/train/packing.py. It sits above the layers that know episodes (trajectories,
the protocol's rendering) and train's row types, and below the experiments (porch_jax/opod builds its own packed
rows from episodes in opod/rows.py, with this package's decision helpers).

Modules:
  decisions   a recorded decision's prompt and target ids (`decision_prompt` checks the server's prompt),
              `token_sources`, `hint_table`
  records     launch/train.py's typed schema (`RecordsConfig`), the rows of each method, `records_trainer`
"""
