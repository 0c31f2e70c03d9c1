"""Where a reader finds spec.data.path: a local file or folder (relative paths under the data
volume's mount), or an object-storage URI, which a reader reads in place or finds staged."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from disttrain_api.model import DataSpec
from disttrain_api.object_store_rules import is_uri

from ..process.config import ConfigError


@dataclass(frozen=True, kw_only=True)
class Source:
    """What a reader reads: `path` a local file or folder (for object storage: the staged copy;
    None: module data without a path), `uri` the s3:// URI for a reader that reads in place,
    `name` how messages name the data (the path or URI as given)."""

    path: Path | None
    name: str
    uri: str | None = None


def kind(d: DataSpec) -> str:
    """"s3" for an object-storage URI, else "local"."""
    return "s3" if is_uri(d.path) else "local"


def resolve_path(d: DataSpec) -> Path:
    """data.path as the trainer reads it: relative paths lie under the data volume's mount.
    (disttrain local makes them absolute first, against the manifest's folder.)"""
    p = Path(d.path or "")
    return p if p.is_absolute() else Path(d.mount_path) / p


def local(d: DataSpec) -> Source:
    """spec.data.path on this machine; refused when it is not there."""
    if not d.path:
        return Source(path=None, name=str(d.factory))
    path = resolve_path(d)
    if not path.exists():
        hint = "" if Path(d.path).is_absolute() else f" (relative paths resolve under spec.data.mountPath {d.mount_path})"
        raise ConfigError(f"spec.data.path: {path} does not exist{hint}")
    return Source(path=path, name=str(path))
