"""Model weights in and out of a run: `model.init` (initial.py) and the final export (export.py).

Both speak the model's own state_dict names (what `model.state_dict()` of the unwrapped module
gives), whatever layout trained it, so an export of a pipeline run starts a data-parallel one.
"""
