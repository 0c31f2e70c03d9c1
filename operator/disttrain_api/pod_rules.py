"""What a worker pod may take from a spec: the `workers.template` allow-list, the volume
types a pod may mount, and the mount paths the operator keeps for itself.

Worker pods satisfy the *restricted* Pod Security Standard whatever the spec says: the
operator sets the security fields itself and a template may only add scheduling hints,
metadata, env, volumes of the types that standard allows, and the trainer's image and
command. Creating a DistTrainJob must never be a way to create a pod its author could not
create in a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.

`validation.py` reports every violation with its field path (`disttrain validate` and the
operator's `InvalidSpec`); the pod builder applies the same allow-list again, so that no
spec that slipped past validation (e.g. one an older operator accepted) yields a pod
outside the restricted profile. Standard library only.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from disttrain_api import constants as c
from disttrain_api.dataparse import FieldError, describe

# Top-level keys of workers.template. env / volumeMounts apply to the trainer container,
# labels / annotations to the pod's metadata, the rest to the pod spec.
TEMPLATE_FIELDS = (
    "env", "volumes", "volumeMounts", "containers", "labels", "annotations", "nodeSelector", "affinity",
    "tolerations", "topologySpreadConstraints", "priorityClassName", "schedulerName", "runtimeClassName",
    "imagePullSecrets",
)
# Keys of one entry of workers.template.containers: the trainer (named `trainer`, or the first
# entry without a name) or a sidecar (named, with an image).
CONTAINER_FIELDS = ("name", "image", "imagePullPolicy", "command", "args", "workingDir", "env", "envFrom",
                    "volumeMounts")
MOUNT_FIELDS = ("name", "mountPath", "readOnly", "subPath", "subPathExpr")
# The volume types the restricted Pod Security Standard allows (no hostPath, no in-line
# network file systems: mount those through a PersistentVolumeClaim, whose volume is the
# cluster admin's object).
VOLUME_SOURCES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                  "secret")
# Volumes the operator adds to pods (topology/common.py; the TLS and identity Secrets of
# topology/credentials.py): a template volume or mount of the same name would replace them.
RESERVED_VOLUMES = ("config", "checkpoints", "dataset", "run", "tmp", c.TLS_VOLUME, c.IDENTITY_VOLUME)
# Annotations that loosen a container's confinement (AppArmor, the pre-1.19 seccomp fields).
RESERVED_ANNOTATION_PREFIXES = ("container.apparmor.security.beta.kubernetes.io/",
                                "seccomp.security.alpha.kubernetes.io/",
                                "container.seccomp.security.alpha.kubernetes.io/")
RESERVED_LABEL_PREFIX = "disttrain.dev/"
# Mount paths the operator uses in every pod, with what they hold, and whether another
# volume may be mounted below them (a mount below the read-only config mount cannot be
# created; one below /tmp is an ordinary nested mount).
RESERVED_PATHS: tuple[tuple[str, str, bool], ...] = (
    (c.CONFIG_MOUNT_DIR, "the trainer config and federated TLS / token mounts", False),
    (c.RUN_MOUNT_DIR, "the run dir", False),
    (c.TMP_MOUNT_DIR, "the writable tmp of the read-only root filesystem", True),
    (c.DEFAULT_TERMINATION_LOG, "the termination log", True),
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def _norm(path: str) -> str:
    return "/" + posixpath.normpath(path).lstrip("/")


def mount_path_error(path: str) -> str | None:
    """Why `path` cannot be a mount path in a worker pod, or None when it can."""
    if not path.startswith("/"):
        return f"{path!r} must be an absolute path"
    if ".." in path.split("/"):
        return f"{path!r} must not contain '..'"
    norm = _norm(path)
    for reserved, what, nested_ok in RESERVED_PATHS:
        inside = norm.startswith(reserved + "/")
        if norm == reserved or reserved.startswith(norm.rstrip("/") + "/") or (inside and not nested_ok):
            return f"{path!r} collides with {reserved} ({what}), which the operator mounts; choose another path"
    return None


def volume_source_error(source: Any) -> tuple[str, str] | None:
    """(key, why) when a volume (a `volumes` entry without its name, or checkpoint.volume) is
    not one the restricted standard allows; None when it is."""
    if not isinstance(source, Mapping):
        return "", f"expected an object, got {describe(source)}"
    kinds = [k for k in source if k != "name"]
    if len(kinds) != 1:
        return "", f"needs exactly one volume type ({', '.join(VOLUME_SOURCES)}), got {sorted(kinds) or 'none'}"
    (kind,) = kinds
    if kind not in VOLUME_SOURCES:
        hint = " (a test cluster's host folder can back a hostPath PersistentVolume, bound by a claim)" \
            if kind == "hostPath" else ""
        return kind, (f"volume type {kind} is not allowed in worker pods (restricted Pod Security Standard); "
                      f"use one of {', '.join(VOLUME_SOURCES)}, e.g. persistentVolumeClaim{hint}")
    return None


def _string_map(value: Any, path: str, errors: list[FieldError]) -> bool:
    if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return True
    errors.append(FieldError(path, f"expected an object of strings, got {describe(value)}"))
    return False


def _objects(value: Any, path: str, errors: list[FieldError]) -> list[Mapping[str, Any]]:
    if isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
        return list(value)
    errors.append(FieldError(path, f"expected a list of objects, got {describe(value)}"))
    return []


def _env(value: Any, path: str, errors: list[FieldError]) -> None:
    for i, entry in enumerate(_objects(value, path, errors)):
        name = entry.get("name")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            errors.append(FieldError(f"{path}[{i}].name", f"{name!r} is not a valid environment variable name"))


def _mounts(value: Any, path: str, volumes: set[str], errors: list[FieldError]) -> list[tuple[str, str]]:
    """Check mounts; returns (field path, normalized mount path) of each."""
    paths: list[tuple[str, str]] = []
    for i, mount in enumerate(_objects(value, path, errors)):
        at = f"{path}[{i}]"
        for key in mount:
            if key not in MOUNT_FIELDS:
                errors.append(FieldError(f"{at}.{key}", f"not allowed in a volume mount (allowed: {', '.join(MOUNT_FIELDS)})"))
        name = mount.get("name")
        if name in RESERVED_VOLUMES:
            errors.append(FieldError(f"{at}.name", f"{name!r} is the operator's volume; name yours differently"))
        elif name not in volumes:
            errors.append(FieldError(f"{at}.name", f"no volume named {name!r} in workers.template.volumes"))
        mount_path = mount.get("mountPath")
        if not isinstance(mount_path, str):
            errors.append(FieldError(f"{at}.mountPath", "required: the absolute path to mount the volume at"))
            continue
        if (why := mount_path_error(mount_path)) is not None:
            errors.append(FieldError(f"{at}.mountPath", why))
        paths.append((f"{at}.mountPath", _norm(mount_path)))
    return paths


def _containers(value: Any, path: str, volumes: set[str], errors: list[FieldError]) -> list[tuple[str, str]]:
    paths: list[tuple[str, str]] = []
    names: set[str] = set()
    for i, container in enumerate(_objects(value, path, errors)):
        at = f"{path}[{i}]"
        for key in container:
            if key not in CONTAINER_FIELDS:
                fix = "set spec.workers.resources" if key == "resources" else \
                    "the operator sets the container's security context" if key == "securityContext" else \
                    f"allowed: {', '.join(CONTAINER_FIELDS)}"
                errors.append(FieldError(f"{at}.{key}", f"not allowed in workers.template.containers ({fix})"))
        name = container.get("name", "trainer" if i == 0 else None)
        if not isinstance(name, str) or not name:
            errors.append(FieldError(f"{at}.name", "a sidecar container needs a name (the trainer's is 'trainer')"))
        elif name in names:
            errors.append(FieldError(f"{at}.name", f"container {name!r} is listed twice"))
        else:
            names.add(name)
            if name != "trainer" and not container.get("image"):
                errors.append(FieldError(f"{at}.image", f"sidecar container {name!r} needs an image"))
        if "env" in container:
            _env(container["env"], f"{at}.env", errors)
        if "volumeMounts" in container:
            paths += _mounts(container["volumeMounts"], f"{at}.volumeMounts", volumes, errors)
    return paths


def template_errors(template: Mapping[str, Any], checkpoint_path: str, path: str = "spec.workers.template"
                    ) -> list[FieldError]:  # fmt: skip
    """Every way `workers.template` leaves the allow-list or the restricted profile."""
    errors: list[FieldError] = []
    for key in template:
        if key not in TEMPLATE_FIELDS:
            errors.append(FieldError(f"{path}.{key}", f"not allowed in workers.template: worker pods keep the "
                                     f"restricted Pod Security profile (allowed: {', '.join(TEMPLATE_FIELDS)})"))
    volumes: set[str] = set()
    for i, volume in enumerate(_objects(template.get("volumes", []), f"{path}.volumes", errors)):
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            errors.append(FieldError(f"{path}.volumes[{i}].name", "required: the name mounts refer to"))
        elif name in RESERVED_VOLUMES:
            errors.append(FieldError(f"{path}.volumes[{i}].name", f"{name!r} is the operator's volume; name yours "
                                     "differently (the checkpoint volume is spec.checkpoint.volume)"))
        else:
            volumes.add(name)
        if (bad := volume_source_error(volume)) is not None:
            key, why = bad
            errors.append(FieldError(f"{path}.volumes[{i}]" + (f".{key}" if key else ""), why))
    mounts: list[tuple[str, str]] = []
    if "volumeMounts" in template:
        mounts += _mounts(template["volumeMounts"], f"{path}.volumeMounts", volumes, errors)
    if "containers" in template:
        mounts += _containers(template["containers"], f"{path}.containers", volumes, errors)
    if "env" in template:
        _env(template["env"], f"{path}.env", errors)
    seen = {_norm(checkpoint_path): "spec.checkpoint.path"}
    for where, mount_path in mounts:
        if mount_path in seen:
            errors.append(FieldError(where, f"{mount_path} is already mounted by {seen[mount_path]}"))
        seen.setdefault(mount_path, where)
    for key, reserved in (("annotations", RESERVED_ANNOTATION_PREFIXES), ("labels", (RESERVED_LABEL_PREFIX,))):
        if key in template and _string_map(template[key], f"{path}.{key}", errors):
            for name in template[key]:
                if name.startswith(reserved):
                    errors.append(FieldError(f"{path}.{key}.{name}", "reserved: set by the operator (or it would "
                                             "loosen the pod's confinement)"))
    if "nodeSelector" in template:
        _string_map(template["nodeSelector"], f"{path}.nodeSelector", errors)
    for key in ("tolerations", "topologySpreadConstraints", "imagePullSecrets"):
        if key in template:
            _objects(template[key], f"{path}.{key}", errors)
    for key in ("priorityClassName", "schedulerName", "runtimeClassName"):
        if key in template and not isinstance(template[key], str):
            errors.append(FieldError(f"{path}.{key}", f"expected a string, got {describe(template[key])}"))
    if "affinity" in template and not isinstance(template["affinity"], Mapping):
        errors.append(FieldError(f"{path}.affinity", f"expected an object, got {describe(template['affinity'])}"))
    return errors


def allowed_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a template the pod builder applies: allow-listed keys, volumes of allowed
    types and unreserved names, mounts of those volumes, containers reduced to their
    allowed fields, annotations and labels without reserved keys. What validation would
    refuse is left out rather than applied."""
    out: dict[str, Any] = {k: v for k, v in template.items() if k in TEMPLATE_FIELDS}
    volumes = [dict(v) for v in out.pop("volumes", None) or [] if isinstance(v, Mapping)
               and v.get("name") not in RESERVED_VOLUMES and volume_source_error(v) is None]
    names = {v["name"] for v in volumes}

    def mounts(value: Any) -> list[dict[str, Any]]:
        return [{k: m[k] for k in MOUNT_FIELDS if k in m} for m in value or [] if isinstance(m, Mapping)
                and m.get("name") in names and isinstance(m.get("mountPath"), str)
                and mount_path_error(m["mountPath"]) is None]

    if volumes:
        out["volumes"] = volumes
    if "volumeMounts" in out:
        out["volumeMounts"] = mounts(out["volumeMounts"])
    if "containers" in out:
        containers = []
        for container in out["containers"] or []:
            if isinstance(container, Mapping):
                kept = {k: container[k] for k in CONTAINER_FIELDS if k in container}
                if "volumeMounts" in kept:
                    kept["volumeMounts"] = mounts(kept["volumeMounts"])
                containers.append(kept)
        out["containers"] = containers
    for key, reserved in (("annotations", RESERVED_ANNOTATION_PREFIXES), ("labels", (RESERVED_LABEL_PREFIX,))):
        if key in out:
            out[key] = {k: v for k, v in (out[key] or {}).items() if not str(k).startswith(reserved)}
    return out


def checkpoint_errors(path: str, volume: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    if (why := mount_path_error(path)) is not None:
        errors.append(FieldError("spec.checkpoint.path", why))
    if volume and (bad := volume_source_error(volume)) is not None:
        key, why = bad
        if key == "" and "name" in volume:
            why = "give only the volume type (the operator names the volume)"
        errors.append(FieldError("spec.checkpoint.volume" + (f".{key}" if key else ""), why))
    elif volume and "name" in volume:
        errors.append(FieldError("spec.checkpoint.volume.name", "give only the volume type (the operator names "
                                 "the volume)"))
    return errors
