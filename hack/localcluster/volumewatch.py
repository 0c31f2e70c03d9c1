"""Dynamic PersistentVolumes for the local cluster: kube-controller-manager's own hostPath
provisioner, made writable for the non-root pods that use it.

`--enable-hostpath-provisioner` makes the controller-manager provision claims of StorageClass
`kubernetes.io/host-path` as a folder `/tmp/hostpath_pv/<uuid>` (the path is fixed in
pkg/volume/hostpath of Kubernetes 1.20) and a hostPath PersistentVolume of it with the claim's
access modes, and delete the folder with the volume (reclaim policy Delete). Upstream calls it
single-node only; here every node is a namespace of one machine, so every node sees the same
folder: a ReadWriteMany volume in fact.

It creates the folder with mode 0750, owned by root, and the kubelet applies no fsGroup to a
hostPath volume, so a pod running as non-root (every disttrain worker runs as uid 10001 under
the restricted Pod Security Standard) could not write there. This watcher opens each new folder
to everyone (0777, as an NFS export for any uid) as soon as it appears: it is told by inotify,
milliseconds after the mkdir, while the PersistentVolume object is still being created and
bound, long before a pod can be scheduled onto it. It also opens whatever is there when it
starts.

Run: python -m localcluster.volumewatch [--dir /tmp/hostpath_pv]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import stat
import sys
from pathlib import Path

VOLUMES_DIR = Path("/tmp/hostpath_pv")
STORAGE_CLASS = "hostpath"
# The default StorageClass of the local cluster (created at bring-up, before any claim).
STORAGE_CLASS_OBJECT = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
    "provisioner": "kubernetes.io/host-path",
    "reclaimPolicy": "Delete",
    "volumeBindingMode": "Immediate",
}
OPEN_MODE = 0o777
RESCAN_S = 5.0  # a safety net besides inotify (e.g. an event queue overflow)
IN_CREATE, IN_MOVED_TO, IN_Q_OVERFLOW = 0x100, 0x80, 0x4000


def open_volumes(root: Path) -> list[Path]:
    """chmod 0777 every volume folder directly below `root` that is not yet; returns them."""
    changed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return changed
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) != OPEN_MODE:
                os.chmod(entry.path, OPEN_MODE)
                changed.append(Path(entry.path))
        except FileNotFoundError:
            continue  # deleted with its volume meanwhile
    return changed


def _inotify(root: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK))
    if fd < 0 or libc.inotify_add_watch(fd, os.fsencode(root), IN_CREATE | IN_MOVED_TO) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"inotify on {root}: {os.strerror(err)}")
    return fd


def watch(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    fd = _inotify(root)  # before the first scan: nothing created in between is missed
    while True:
        for path in open_volumes(root):
            print(f"opened {path} (mode 0777)", flush=True)
        ready, _, _ = select.select([fd], [], [], RESCAN_S)
        if ready:
            try:
                os.read(fd, 64 * 1024)  # which entry does not matter: the next scan looks at all
            except BlockingIOError:
                pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="volumewatch", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dir", type=Path, default=VOLUMES_DIR)
    a = ap.parse_args(argv)
    watch(a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
