"""Checkpoints: written whole by rank 0 (whole.py) or sharded by every rank (sharded.py), in one
directory layout (directory.py) that only the newest writer may change (fence.py); which one a
gang resumes from (resume.py) and the per-rank state every checkpoint carries (rank_state.py)."""
