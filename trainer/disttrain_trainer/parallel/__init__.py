"""Mode-independent building blocks of parallel training: the job's DeviceMesh (mesh.py), DDP with
its communication clock (ddp.py), FSDP2 (fsdp.py), tensor-parallel plans (tensor.py), their
combination on a mesh (hybrid.py), the profiler-measured communication of mesh steps
(comm_profile.py), a model as ordered pipeline blocks (blocks.py) and activation checkpointing
(activation_checkpointing.py). The modes (disttrain_trainer.modes) put them together."""
