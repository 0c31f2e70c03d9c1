"""Pipeline parallel: mode pipeline, and mode hybrid with pipeline > 1."""
