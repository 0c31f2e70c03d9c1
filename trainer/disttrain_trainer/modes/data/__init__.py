"""Data parallel and its layouts: DDP, FSDP, tensor parallel and hybrid without a pipeline."""
