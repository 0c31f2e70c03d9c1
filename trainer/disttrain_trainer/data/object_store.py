"""Object storage (s3:// URIs) through fsspec's s3fs: one client per process, and the checks that
turn a store's refusal into a clear, permanent error before training starts.

Credentials come from the environment's AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
which the operator fills from spec.objectStore.credentialsSecret; a profile or a node role
elsewhere); endpoint and region from spec.objectStore, else from the environment
(AWS_ENDPOINT_URL, AWS_REGION).

What `check_*` raises:
- ConfigError (exit 2, the same on every retry): the bucket does not exist, the credentials are
  refused, the object or prefix is not there;
- StoreUnreachable (exit 1, a gang restart may find it up): the endpoint does not answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disttrain_api import constants as C
from disttrain_api.model import JobSpec
from disttrain_api.object_store_rules import is_uri

from ..process.config import ConfigError
from ..process.safe_paths import UnsafePath, contained
from .cache import build_once

__all__ = ["StoreUnreachable", "Store", "check_bucket", "is_uri", "split", "stage", "store_for"]

# Attempts before "unreachable": a missing endpoint fails in seconds, not minutes. botocore retries
# each request (with backoff); s3fs retries the call on top, for errors botocore passes through.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3
S3FS_ATTEMPTS = 2


class StoreUnreachable(RuntimeError):
    """The object store's endpoint did not answer: transient (exit 1), the gang is retried."""


def split(uri: str) -> tuple[str, str]:
    """s3://bucket/key/... -> (bucket, key/...) without slashes at the ends of the key."""
    bucket, _, key = uri[len(C.OBJECT_STORE_SCHEME):].partition("/")
    return bucket, key.strip("/")


@dataclass(frozen=True, kw_only=True)
class Store:
    """How to reach the store: spec.objectStore, with the environment's AWS settings beneath it."""

    endpoint: str | None = None
    region: str | None = None

    def describe(self) -> str:
        return self.endpoint or "AWS S3"

    def filesystem(self) -> Any:
        """This process's s3fs filesystem (one per Store: s3fs keeps its own event loop thread)."""
        with _LOCK:
            fs = _FILESYSTEMS.get(self)
            if fs is None:
                fs = _FILESYSTEMS[self] = _new_filesystem(self)
            return fs


_LOCK = threading.Lock()
_FILESYSTEMS: dict[Store, Any] = {}


def _new_filesystem(store: Store) -> Any:
    import s3fs  # noqa: PLC0415 - s3fs, only for jobs that name an s3:// URI

    client: dict[str, Any] = {}
    if store.region:
        client["region_name"] = store.region
    fs = s3fs.S3FileSystem(
        endpoint_url=store.endpoint or None,
        client_kwargs=client,
        config_kwargs={"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
                       "retries": {"max_attempts": MAX_ATTEMPTS, "mode": "standard"}},  # fmt: skip
        # Checkpoints are listed again after every write: a cached listing would hide new ones.
        use_listings_cache=False,
        skip_instance_cache=True,
    )
    fs.retries = S3FS_ATTEMPTS  # s3fs's default is 5, each with a growing sleep
    return fs


def store_for(spec: JobSpec) -> Store:
    s = spec.object_store
    endpoint = (s.endpoint if s else None) or os.environ.get(C.ENV_AWS_ENDPOINT_URL) or None
    region = (s.region if s else None) or os.environ.get(C.ENV_AWS_REGION) or None
    return Store(endpoint=endpoint.rstrip("/") if endpoint else None, region=region)


def _unreachable(e: BaseException) -> bool:
    import aiohttp  # noqa: PLC0415 - aiohttp, with s3fs only where a URI is given
    from botocore.exceptions import ConnectionError as BotoConnectionError  # noqa: PLC0415 - botocore, with s3fs

    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, (BotoConnectionError, aiohttp.ClientConnectionError, ConnectionError, TimeoutError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def explain(e: BaseException, uri: str, field: str, store: Store) -> BaseException:
    """The error to raise for a failed call on `uri`: ConfigError or StoreUnreachable."""
    if _unreachable(e):
        return StoreUnreachable(f"{field}: the object store {store.describe()} is not reachable for {uri} "
                                f"({type(e).__name__}: {e})")  # fmt: skip
    if isinstance(e, PermissionError):
        return ConfigError(f"{field}: {store.describe()} refused access to {uri} ({e}); check the credentials "
                           "(spec.objectStore.credentialsSecret: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and "
                           "their permissions")  # fmt: skip
    return ConfigError(f"{field}: {uri}: {type(e).__name__}: {e}")


def check_bucket(store: Store, uri: str, field: str) -> None:
    """The bucket of `uri` exists and these credentials may use it."""
    bucket, _ = split(uri)
    try:
        store.filesystem().call_s3("head_bucket", Bucket=bucket)
    except FileNotFoundError:
        raise ConfigError(f"{field}: bucket {bucket!r} of {uri} does not exist at {store.describe()}") from None
    except Exception as e:  # noqa: BLE001 - sorted into permanent and transient by explain()
        raise explain(e, uri, field, store) from None


def info(store: Store, uri: str, field: str) -> dict[str, Any] | None:
    """The object `uri` (size, ETag), a dict of type "directory" for a prefix, None: neither exists.
    Checks the bucket and credentials first."""
    check_bucket(store, uri, field)
    try:
        return dict(store.filesystem().info(uri))
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001
        raise explain(e, uri, field, store) from None


def fingerprint(store: Store, uri: str, field: str) -> list[list[Any]]:
    """Key, size and ETag of the object `uri`, or of every object under the prefix `uri`: a change
    stages the data again."""
    found = info(store, uri, field)
    if found is None:
        raise ConfigError(f"{field}: {uri} does not exist (neither an object nor a prefix with objects) at "
                          f"{store.describe()}")  # fmt: skip
    fs = store.filesystem()
    try:
        if found.get("type") == "directory":
            listing = fs.find(uri, detail=True)
            objs = [listing[k] for k in sorted(listing)]
        else:
            objs = [found]
    except Exception as e:  # noqa: BLE001
        raise explain(e, uri, field, store) from None
    if not objs:
        raise ConfigError(f"{field}: the prefix {uri} holds no objects")
    return [[o["name"], int(o.get("size") or 0), str(o.get("ETag") or o.get("LastModified") or "")] for o in objs]


def stage(spec: JobSpec, cache: Path) -> Path:
    """The data at spec.data.path (s3://) copied once into the data cache; the local path.

    For the formats not read in place (all but tokens): one download per job when the cache is
    shared (cache.py), keyed by every object's ETag and size, so changed data is staged again."""
    store, uri = store_for(spec), str(spec.data.path)
    objs = fingerprint(store, uri, "spec.data.path")
    digest = hashlib.sha256(json.dumps([uri, objs]).encode()).hexdigest()[:16]
    target = cache / f"s3-{digest}"
    _, key = split(uri)
    base = key.rsplit("/", 1)[-1] or "data"
    single = len(objs) == 1 and objs[0][0].rstrip("/") == uri[len(C.OBJECT_STORE_SCHEME):].rstrip("/")

    def download(tmp: Path) -> None:
        fs = store.filesystem()
        try:
            top = contained(tmp, base, what=f"{uri}: its last segment", flat=True)
            if single:
                fs.get_file(uri, str(top))
            else:
                prefix = uri[len(C.OBJECT_STORE_SCHEME):].rstrip("/") + "/"
                for name, _, _ in objs:
                    # A key is the bucket's to choose: one naming `..` or an absolute path is refused.
                    local = contained(top, name[len(prefix):], what=f"object key {C.OBJECT_STORE_SCHEME}{name}")
                    local.parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(f"{C.OBJECT_STORE_SCHEME}{name}", str(local))
        except UnsafePath as e:
            raise ConfigError(f"spec.data.path: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise explain(e, uri, "spec.data.path", store) from None
        (tmp / ".staged").write_text(json.dumps(objs))

    build_once(target, download, done=".staged", what=uri)
    return target / base
