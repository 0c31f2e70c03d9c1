"""Process exit codes of the trainer and of `disttrain local` / `disttrain validate`.

The operator and the local launcher decide from them whether a failed worker is
worth a restart, so they mean one thing each:

- FAILED (1) is transient: a peer that does not resolve yet, a rendezvous
  timeout, a checkpoint not yet visible, a crash. The gang is restarted (up to
  runPolicy.backoffLimit) and resumes from the newest checkpoint.
- CONFIG (2) is permanent: the same spec fails the same way on every retry (a
  rule the spec breaks, fp16 without a GPU, a `module:factory` that does not
  import, a batch larger than the dataset). Nothing is restarted.
"""

from __future__ import annotations

OK = 0
FAILED = 1
CONFIG = 2
INTERRUPTED = 130

# Exit codes after which a restart cannot help.
PERMANENT = frozenset({CONFIG})

MEANING = {
    OK: "succeeded",
    FAILED: "failed; transient, retried up to runPolicy.backoffLimit",
    CONFIG: "invalid manifest or config rejected; permanent, never retried",
    INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)",
}

# The operator's own exit when its leader Lease was not renewed in time: it stopped before
# a standby may take over, and its Deployment restarts it as a standby (sysexits'
# EX_TEMPFAIL: a retry is expected to work). Never a trainer's code.
LEASE_LOST = 75
