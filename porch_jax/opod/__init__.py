"""The OPOD experiment: rows built from episodes (rows.py) and the whole loop (experiment.py)."""
