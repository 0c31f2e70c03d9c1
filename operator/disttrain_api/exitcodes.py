"""Process exit codes of the trainer and of `disttrain local` / `disttrain validate` (and of the job
commands `submit`, `status`, `logs`, `delete`: FAILED when the cluster refuses or cannot be reached,
CONFIG for an invalid manifest).

The operator and the local launcher decide from them whether a failed worker is
worth a restart, so they mean one thing each:

- FAILED (1) is transient: a peer that does not resolve yet, a rendezvous
  timeout, a checkpoint not yet visible, a crash. The gang is restarted (up to
  runPolicy.backoffLimit) and resumes from the newest checkpoint.
- CONFIG (2) is permanent: the same spec fails the same way on every retry (a
  rule the spec breaks, fp16 without a GPU, a `module:factory` that does not
  import, a batch larger than the dataset). Nothing is restarted.
- STOPPED (3) is "stopped on request": the process got SIGTERM (Kubernetes
  deleting, evicting, draining or preempting its pod, a suspend, `disttrain
  local` stopping its gang) or a peer did, every rank stopped at the same step
  and the state of that step is checkpointed; the next gang resumes from that
  step. It is a disruption (status.disruptions, never against
  runPolicy.backoffLimit) only when a stop was asked for: the pod was being
  deleted or carries a DisruptionTarget condition (operator), or the launcher
  itself sent the SIGTERM (`disttrain local`). An exit 3 nobody asked for (the
  model's own code exited 3) counts against backoffLimit like FAILED. A process
  killed before it could save (SIGKILL after the grace period) exits 137, which
  is a failure.
- FENCED (4): a newer writer claimed the job's checkpoint directory (checkpoint
  fencing): the process belonged to a gang that was replaced while it still ran (its
  node was declared lost and its pod force-deleted), so it stopped without writing.
  Its pod is gone and nobody counts the exit; on a live pod it means two jobs share
  one checkpoint directory.
"""

from __future__ import annotations

OK = 0
FAILED = 1
CONFIG = 2
STOPPED = 3
FENCED = 4
INTERRUPTED = 130

# Exit codes after which a restart cannot help.
PERMANENT = frozenset({CONFIG})

MEANING = {
    OK: "succeeded",
    FAILED: "failed; transient, retried up to runPolicy.backoffLimit",
    CONFIG: "invalid manifest or config rejected; permanent, never retried",
    STOPPED: "stopped on request (SIGTERM) after checkpointing its step; a disruption (not counted as a restart) "
             "when the pod was being deleted or the launcher sent the stop, else a failure",
    FENCED: "fenced: a newer gang claimed the checkpoint directory; this process stopped without writing",
    INTERRUPTED: "interrupted (Ctrl-C)",
}

# The operator's own exit when its leader Lease was not renewed in time: it stopped before
# a standby may take over, and its Deployment restarts it as a standby (sysexits'
# EX_TEMPFAIL: a retry is expected to work). Never a trainer's code.
LEASE_LOST = 75
