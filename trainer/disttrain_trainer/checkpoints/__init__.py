"""Checkpoints: written whole by rank 0 (whole.py) or sharded by every rank (sharded.py), in one
directory layout (directory.py) that only the newest writer may change (fence.py); which one a
gang resumes from (resume.py) and the per-rank state every checkpoint carries (rank_state.py).
Everything is read back as tensors and plain values, never unpickled (safe_state.py; convert.py
rewrites trusted checkpoints of the older form); with spec.checkpoint.uri the directory is staging
for a bucket prefix (remote.py), whose writers are fenced there too (remote_fence.py)."""
