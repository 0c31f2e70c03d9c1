"""Cross-field rules of object storage: s3:// URIs in spec.data.path and spec.checkpoint.uri, and
what they exclude (a data or checkpoint volume beside them).

Whether the bucket exists and the credentials are accepted is the trainer's check before
training starts (disttrain_trainer.object_store): the operator never reads the Secret."""

from __future__ import annotations

import re

from . import constants as C
from .model import JobSpec
from .rule_checker import Checker

# S3 bucket names: 3-63 lowercase letters, digits, dots and hyphens, a letter or digit at each end.
_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
_URI = re.compile(rf"^s3://{_BUCKET}(/[^\s]*)?$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(path: str | None) -> bool:
    """A path that names an object store (s3://...), not a file."""
    return bool(path) and str(path).startswith(C.OBJECT_STORE_SCHEME)


def uri_error(uri: str, *, key_required: bool) -> str | None:
    """Why `uri` is not a usable s3:// URI, or None."""
    if not _URI.match(uri):
        return (f"{uri!r} is not an s3://bucket/key URI (bucket: 3-63 lowercase letters, digits, dots or "
                "hyphens; no spaces)")  # fmt: skip
    key = uri[len(C.OBJECT_STORE_SCHEME):].partition("/")[2].strip("/")
    if key_required and not key:
        return f"{uri!r} names a whole bucket; name the object or prefix that holds the data (s3://bucket/key)"
    if "//" in key:
        return f"{uri!r} has an empty path segment ('//')"
    return None


def object_store(spec: JobSpec, c: Checker) -> None:
    d, ck = spec.data, spec.checkpoint
    if c.ok("spec.data.path") and d.path:
        if is_uri(d.path):
            if (why := uri_error(d.path, key_required=True)) is not None:
                c.add("spec.data.path", why)
            elif c.ok("spec.data.volume") and d.volume:
                c.add("spec.data.volume", f"the data comes from object storage ({d.path}); remove spec.data.volume "
                      "or give a path on it")  # fmt: skip
        elif _SCHEME.match(d.path):
            c.add("spec.data.path", f"{d.path!r}: only s3:// URIs (or file paths) are read")
    if c.ok("spec.checkpoint.uri") and ck.uri is not None:
        if not is_uri(ck.uri):
            c.add("spec.checkpoint.uri", f"{ck.uri!r}: give an s3://bucket/prefix URI (checkpoints on a volume: "
                  "spec.checkpoint.volume)")  # fmt: skip
        elif (why := uri_error(ck.uri, key_required=False)) is not None:
            c.add("spec.checkpoint.uri", why)
        elif c.ok("spec.checkpoint.volume") and ck.volume:
            c.add("spec.checkpoint.uri", "not together with spec.checkpoint.volume: checkpoints go to object "
                  "storage or to a volume; remove one")  # fmt: skip
    s = spec.object_store
    if (spec.mode in ("federated", "paramserver") and ck.uri is not None and is_uri(d.path) and s is not None
            and s.credentials_secret and not s.data_credentials_secret):  # fmt: skip
        c.add("spec.objectStore.dataCredentialsSecret",
              f"with checkpoint.uri, credentialsSecret goes only to the pods that write checkpoints; the {spec.mode} "
              f"{'clients' if spec.mode == 'federated' else 'workers'} read {d.path} too: name a Secret with read "
              "access to the data (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")  # fmt: skip
