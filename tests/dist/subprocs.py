"""What a test shows when it gives up waiting on a child process it started."""

from __future__ import annotations

import subprocess


def output_after_kill(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The child's (stdout, stderr), killed first if it still runs: `communicate()` on a child that
    trains on (a deadline passed, not the child's end) would wait past the test's own timeout and
    show nothing of what happened."""
    if proc.poll() is None:
        proc.kill()
    return proc.communicate()
