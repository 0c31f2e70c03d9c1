"""Images without a registry: build (only when inputs change), archive, import into nodes.

- pause:   the static pause binary from the Kubernetes source, packed with umoci
- test:    Debian's static busybox, packed with umoci (tiny image for cluster tests)
- base:    debootstrap --variant=minbase bookworm + python3/python3-venv, committed with buildah
- trainer / operator: the root Dockerfile, `buildah bud --isolation chroot` (vfs) on the base,
           dependencies from a host wheelhouse (build/wheels)
- my-model: the example user image (examples/my_model): the trainer image's layers plus one layer
           with the package installed, added with umoci (see user_image for why not buildah)
Each ends as an OCI archive whose ref name is the tag; nodes import it with --base-name, so the
image lands under its final name (docker.io/library/disttrain-trainer:dev, ...).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .config import (
    OPERATOR_IMAGE,
    PAUSE_IMAGE,
    REPO_ROOT,
    TEST_IMAGE,
    TRAINER_IMAGE,
    USER_IMAGE,
    ClusterConfig,
    NodeConfig,
    cache_dir,
)
from .proc import ClusterError, locked, run, say

BASE_IMAGE = "localhost/disttrain-base:bookworm"
WHEELS = REPO_ROOT / "build" / "wheels"
RESOLVER_PINS = REPO_ROOT / "hack" / "resolver-pins.txt"  # the venv's constraints (Makefile), for the same resolution
BUILDAH = ["buildah", "--storage-driver", "vfs"]
# README.md is needed by the build (package metadata) but does not change what runs: not hashed.
PROJECT_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "operator", "trainer", "cli")


@dataclass(frozen=True, kw_only=True)
class Archive:
    ref: str  # full image name, e.g. docker.io/library/disttrain-trainer:dev
    path: Path
    digest: str  # hash of the inputs it was built from

    @property
    def repo(self) -> str:
        return self.ref.rsplit(":", 1)[0]


def images_dir() -> Path:
    d = cache_dir() / "images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def log_path() -> Path:
    p = cache_dir() / "logs" / "images.log"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _hash_paths(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for root in paths:
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc" and ".egg-info" not in str(p))
        for f in files:
            h.update(str(f.relative_to(REPO_ROOT) if f.is_relative_to(REPO_ROOT) else f).encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def _fresh(name: str, digest: str) -> Path | None:
    tar, stamp = images_dir() / f"{name}.tar", images_dir() / f"{name}.hash"
    if tar.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return tar
    return None


def _done(name: str, digest: str) -> None:
    (images_dir() / f"{name}.hash").write_text(digest)


def _archive(name: str, ref: str, layout: Path, work: Path, digest: str, t0: float) -> Archive:
    """The OCI layout packed as images/<name>.tar, its build folder removed, the digest recorded."""
    out = images_dir() / f"{name}.tar"
    run(["tar", "-C", layout, "-cf", out, "."], step="image " + name, log=log_path())
    shutil.rmtree(work, ignore_errors=True)
    _done(name, digest)
    say(f"image {ref} built in {time.monotonic() - t0:.1f}s")
    return Archive(ref=ref, path=out, digest=digest)


def _umoci_image(name: str, ref: str, digest: str, files: dict[str, Path], links: dict[str, str],
                 config: list[str]) -> Archive:
    """A one-layer image from a few host files, with umoci (no daemon, no registry)."""
    tar = _fresh(name, digest)
    if tar:
        return Archive(ref=ref, path=tar, digest=digest)
    t0 = time.monotonic()
    work = images_dir() / f"{name}.work"
    shutil.rmtree(work, ignore_errors=True)
    layout, bundle, tag = work / "layout", work / "bundle", ref.rsplit(":", 1)[1]
    log, step = log_path(), f"image {name}"
    run(["umoci", "init", "--layout", layout], step=step, log=log)
    run(["umoci", "new", "--image", f"{layout}:{tag}"], step=step, log=log)
    run(["umoci", "unpack", "--image", f"{layout}:{tag}", bundle], step=step, log=log)
    rootfs = bundle / "rootfs"
    for dest, src in files.items():
        (rootfs / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, rootfs / dest)
    for dest, target in links.items():
        (rootfs / dest).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / dest).symlink_to(target)
    (rootfs / "tmp").mkdir(mode=0o1777, exist_ok=True)
    run(["umoci", "repack", "--image", f"{layout}:{tag}", bundle], step=step, log=log)
    run(["umoci", "config", "--image", f"{layout}:{tag}", *config], step=step, log=log)
    run(["umoci", "gc", "--layout", layout], step=step, log=log)
    return _archive(name, ref, layout, work, digest, t0)


def pause_image(bins: Path) -> Archive:
    pause = bins / "pause"
    return _umoci_image("pause", PAUSE_IMAGE, _hash_paths([pause]), {"pause": pause}, {},
                        ["--config.entrypoint", "/pause"])


def test_image() -> Archive:
    bb = Path("/bin/busybox")
    if not bb.exists():
        raise ClusterError("image test", "/bin/busybox missing; install Debian's busybox-static")
    applets = run([bb, "--list"], step="image test").stdout.split()
    links = {f"bin/{a}": "busybox" for a in applets if a != "busybox"}
    return _umoci_image("test", TEST_IMAGE, _hash_paths([bb]), {"bin/busybox": bb}, links,
                        ["--config.cmd", "sh", "--config.env", "PATH=/bin"])


def base_image() -> str:
    """debootstrap bookworm (+python3, python3-venv) committed as BASE_IMAGE; returns its id."""
    res = run([*BUILDAH, "images", "-q", "--no-trunc", BASE_IMAGE], step="image base", check=False)
    if res.returncode == 0 and res.stdout.strip():
        return res.stdout.split()[0]
    log, step = log_path(), "image base (debootstrap)"
    rootfs = images_dir() / "base-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    t0 = time.monotonic()
    run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", rootfs,
         "http://deb.debian.org/debian"], step=step, log=log, timeout=900)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (rootfs / junk).glob("*"):
            if p.is_file():
                p.unlink()
    say(f"debootstrap took {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    ctr = run([*BUILDAH, "from", "scratch"], step=step, log=log).stdout.strip()
    mnt = run([*BUILDAH, "mount", ctr], step=step, log=log).stdout.strip()
    run(["cp", "-a", f"{rootfs}/.", mnt], step=step, log=log)
    run([*BUILDAH, "umount", ctr], step=step, log=log)
    run([*BUILDAH, "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
         "--cmd", "python3", ctr], step=step, log=log)
    run([*BUILDAH, "commit", "--rm", ctr, BASE_IMAGE], step=step, log=log, timeout=600)
    shutil.rmtree(rootfs, ignore_errors=True)
    say(f"base image committed in {time.monotonic() - t0:.1f}s")
    return base_image()


def wheelhouse() -> str:
    """build/wheels: every dependency wheel (re-resolved only when pyproject.toml changes) plus
    the project's own wheel (rebuilt when its sources change). Returns the inputs' hash."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    torch_pin = _venv_torch_pin()
    deps_digest = _hash_paths([REPO_ROOT / "pyproject.toml", RESOLVER_PINS], extra=torch_pin)
    stamp = WHEELS / ".deps"
    log, step = log_path(), "wheelhouse"
    if not stamp.exists() or stamp.read_text() != deps_digest:
        t0 = time.monotonic()
        # A fresh fill: wheels of an earlier resolution (a CUDA torch and its nvidia-* wheels)
        # would stay candidates for the image's `pip install --find-links`.
        for old in WHEELS.glob("*.whl"):
            old.unlink()
        pins = WHEELS.parent / "wheelhouse-constraints.txt"
        pins.write_text(torch_pin + "\n")
        # Reads this machine's pip configuration (local find-links/index with the CPU torch wheel).
        run([*pip, "wheel", "-q", "-w", WHEELS, "-c", pins, "-c", RESOLVER_PINS, f"{REPO_ROOT}[trainer,operator]"],
            step=step, log=log, timeout=1800)
        stamp.write_text(deps_digest)
        say(f"wheelhouse filled in {time.monotonic() - t0:.1f}s ({torch_pin.strip() or 'torch unpinned'})")
    proj = _hash_paths([REPO_ROOT / p for p in PROJECT_INPUTS if (REPO_ROOT / p).exists()])
    pstamp = WHEELS / ".project"
    if not pstamp.exists() or pstamp.read_text() != proj:
        for old in WHEELS.glob("disttrain-*.whl"):
            old.unlink()
        run([*pip, "wheel", "-q", "--no-deps", "-w", WHEELS, REPO_ROOT], step=step, log=log, timeout=600)
        pstamp.write_text(proj)
    return proj + deps_digest


def _venv_torch_pin() -> str:
    """The torch build installed beside this interpreter (the venv `make` built), as a pin.

    The image gets the same build as the tests: pip, resolving the whole project, may backtrack
    from the local CPU wheel (2.13.0+cpu) onto PyPI's CUDA build of the same version, several GB
    more in every node's image store. Empty where torch is not installed here."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"torch=={version('torch')}"
    except PackageNotFoundError:
        return ""


def project_images() -> list[Archive]:
    if os.environ.get("DISTTRAIN_REUSE_IMAGES") == "1":
        # Development knob: take the archives as they are, even if the sources moved on.
        found = [(t, r, images_dir() / f"{t}.tar") for t, r in (("trainer", TRAINER_IMAGE), ("operator", OPERATOR_IMAGE))]
        if all(p.exists() for _, _, p in found):
            return [Archive(ref=r, path=p, digest=(images_dir() / f"{t}.hash").read_text().strip()) for t, r, p in found]
    base_id = base_image()
    digest = hashlib.sha256((wheelhouse() + base_id).encode()).hexdigest()[:16]
    out = []
    for target, ref in (("trainer", TRAINER_IMAGE), ("operator", OPERATOR_IMAGE)):
        tar = _fresh(target, digest)
        if tar is None:
            tar = _build_target(target, ref)
            _done(target, digest)
        out.append(Archive(ref=ref, path=tar, digest=digest))
    return out


def _build_target(target: str, ref: str) -> Path:
    log, step = log_path(), f"image {target} (buildah bud)"
    t0 = time.monotonic()
    # No --layers: buildah's layer cache keys a RUN on its text, not on the bind-mounted
    # wheelhouse, so a cached layer would keep a stale project. Inputs are hashed above instead.
    run([*BUILDAH, "bud", "--isolation", "chroot", "--pull=never", "-f", REPO_ROOT / "Dockerfile",
         "--target", target, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", ref, REPO_ROOT],
        step=step, log=log, timeout=1800)
    t1 = time.monotonic()
    tar = images_dir() / f"{target}.tar"
    tar.unlink(missing_ok=True)
    # Uncompressed layers (-D): gzip of ~1 GB costs minutes on a busy 2-core box, and the
    # archive only travels to the local containerd, which would gunzip it again.
    run([*BUILDAH, "push", "-D", ref, f"oci-archive:{tar}:{ref.rsplit(':', 1)[1]}"], step=step, log=log, timeout=900)
    # The archive is the image from now on. Left in buildah's vfs store (a full copy of every
    # layer), each rebuild's image and its dangling predecessor took ~2 GB until the disk filled
    # and the kubelets tainted their nodes with disk pressure.
    run([*BUILDAH, "rmi", ref], step=step, log=log, timeout=600)
    # Best effort: a dangling image that an interrupted build's working container still uses
    # stays (buildah refuses it), the rest goes.
    run([*BUILDAH, "rmi", "--prune"], step=step, log=log, timeout=600, check=False)
    say(f"image {ref}: buildah bud {t1 - t0:.1f}s, push to OCI archive {time.monotonic() - t1:.1f}s "
        f"({tar.stat().st_size / 1e6:.0f} MB)")
    return tar


USER_EXAMPLE = REPO_ROOT / "examples" / "my_model"
# Where the trainer image's venv keeps its packages (root Dockerfile: `python3 -m venv /opt/venv`
# on a Python 3.11 base), i.e. where the example Dockerfile's `pip install` puts the package.
TRAINER_SITE_PACKAGES = "/opt/venv/lib/python3.11/site-packages"


def user_image(trainer: Archive) -> Archive:
    """The example user image: the trainer image with examples/my_model installed, as the
    example's Dockerfile builds it (`FROM` the trainer image, `pip install --no-deps` into its
    venv, the same user), rebuilt when the package or the trainer image changes.

    Not `buildah bud` of that Dockerfile: with the vfs driver buildah copies the trainer image's
    full root file system once per layer to pull it from its archive, again for the build
    container, and re-hashes every layer at commit; measured 150 s on a 2-core machine (plus
    10 s to push) for a package of a few kilobytes. Here the trainer archive's layers are kept
    byte for byte (the nodes already hold them) and umoci adds one layer: the package as
    `pip install --no-deps --target` lays it out, checked importable first."""
    name, tag = "my-model", USER_IMAGE.rsplit(":", 1)[1]
    sources = [USER_EXAMPLE / "pyproject.toml", USER_EXAMPLE / "my_model"]
    digest = _hash_paths(sources, extra=trainer.digest)
    tar = _fresh(name, digest)
    if tar:
        return Archive(ref=USER_IMAGE, path=tar, digest=digest)
    t0 = time.monotonic()
    log, step = log_path(), f"image {name}"
    work = images_dir() / f"{name}.work"
    shutil.rmtree(work, ignore_errors=True)
    layout, src, site = work / "layout", work / "src", work / "site-packages"
    layout.mkdir(parents=True)
    # A copy of the sources, as the Dockerfile's COPY: setuptools writes its egg-info next to them.
    src.mkdir()
    shutil.copy2(sources[0], src / "pyproject.toml")
    shutil.copytree(sources[1], src / "my_model", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", site, src],
        step=step, log=log, timeout=600)
    run([sys.executable, "-c", "import my_model.model"], step=step, log=log, env={**os.environ, "PYTHONPATH": str(site)})
    run(["tar", "-C", layout, "-xf", trainer.path], step=step, log=log)
    trainer_tag = trainer.ref.rsplit(":", 1)[1]
    run(["umoci", "insert", "--image", f"{layout}:{trainer_tag}", "--tag", tag,
         "--history.created_by", f"pip install --no-deps {USER_EXAMPLE.relative_to(REPO_ROOT)}", site,
         TRAINER_SITE_PACKAGES], step=step, log=log)
    if trainer_tag != tag:
        run(["umoci", "rm", "--image", f"{layout}:{trainer_tag}"], step=step, log=log)
    return _archive(name, USER_IMAGE, layout, work, digest, t0)


def ensure_all(bins: Path) -> dict[str, Archive]:
    with locked(images_dir() / ".lock"):
        project = project_images()
        trainer = next(a for a in project if a.ref == TRAINER_IMAGE)
        archives = [pause_image(bins), test_image(), *project, user_image(trainer)]
    return {a.ref: a for a in archives}


def _imported(cfg: ClusterConfig, node: NodeConfig) -> dict[str, str]:
    """ref -> digest of the archives imported into the node's image store (kept across restarts)."""
    stamp = cfg.node_image_store(node) / "imported.json"
    return json.loads(stamp.read_text()) if stamp.exists() else {}


def check_disk(cfg: ClusterConfig, archives: dict[str, Archive]) -> None:
    """Refuse to start imports the disk cannot hold, naming the figures, instead of a ctr error
    half-way through. A node stores an archive's blobs and unpacks them once more (the
    snapshots): twice the archive per node that lacks it (an upper bound: images that share
    layers, like my-model on the trainer, store the shared ones once)."""
    held = [_imported(cfg, n) for n in cfg.nodes]
    need = sum(2 * a.path.stat().st_size for done in held for a in archives.values() if done.get(a.ref) != a.digest)
    store = cache_dir() / "containerd"
    store.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(store).free
    if need > free:
        raise ClusterError("image import", f"the nodes' images need up to {need / 1e9:.1f} GB under {store}, "
                           f"{free / 1e9:.1f} GB is free; free some, or point DISTTRAIN_CACHE at a larger disk")  # fmt: skip


def import_into(cfg: ClusterConfig, node: NodeConfig, archives: dict[str, Archive]) -> bool:
    """Import archives the node lacks or has in an older build; True when anything changed."""
    from .node import ctr

    stamp = cfg.node_image_store(node) / "imported.json"
    done = _imported(cfg, node)
    present = set(run(ctr(cfg, node, "images", "ls", "-q"), step="image import").stdout.split())
    changed = False
    for a in archives.values():
        if done.get(a.ref) == a.digest and a.ref in present:
            continue
        t0 = time.monotonic()
        run(ctr(cfg, node, "images", "import", "--base-name", a.repo, str(a.path)),
            step=f"image import {a.ref} into {node.name}", log=log_path(), timeout=900)
        done[a.ref] = a.digest
        stamp.write_text(json.dumps(done))
        changed = True
        say(f"imported {a.ref} into {node.name} in {time.monotonic() - t0:.1f}s")
    return changed


