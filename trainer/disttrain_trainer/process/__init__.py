"""One trainer process: its config (parsed once), the process group and device, precision, the
garbage collector around a loop, and stopping on request (SIGTERM)."""
