"""Local paths made from names someone else chose (object keys, a commit marker's file list): a name
that would resolve outside its folder is refused, never joined.

`Path("staging") / "/etc/passwd"` is `/etc/passwd`, and `..` climbs out; a symlink already in the
folder can point anywhere. So a name is refused when it is empty, absolute, has a `..` component or
a NUL, and the joined path is resolved (symlinks followed) and must still lie inside the folder.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class UnsafePath(ValueError):
    """A name that would resolve outside the folder it belongs in."""


def problem(name: str, *, flat: bool = False) -> str | None:
    """Why `name` cannot be a path below a folder (`flat`: a file directly in it), or None."""
    if not name or "\x00" in name:
        return "is empty or holds a NUL byte"
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        return "is absolute"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' component"
    if flat and (len(parts) != 1 or name == "."):
        return "is not a plain file name"
    return None


def contained(folder: Path, name: str, *, what: str, flat: bool = False) -> Path:
    """folder / name, or UnsafePath naming `what` (e.g. "object key 's3://b/k'") and the reason."""
    why = problem(name, flat=flat)
    path = folder / name
    if why is None:
        base = folder.resolve()
        resolved = path.resolve()
        if resolved != base and base not in resolved.parents:
            why = f"resolves to {resolved}, outside {base}"
    if why is not None:
        raise UnsafePath(f"{what} {why}: it would be written outside {folder}; refused")
    return path
