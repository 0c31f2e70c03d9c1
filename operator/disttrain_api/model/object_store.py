"""spec.objectStore: how workers reach the S3-compatible store behind s3:// URIs
(spec.data.path, spec.checkpoint.uri)."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import fld
from .vocabulary import DNS_SUBDOMAIN_PATTERN, ENDPOINT_PATTERN


@dataclass(frozen=True, kw_only=True)
class ObjectStoreSpec:
    endpoint: str | None = fld(
        None,
        pattern=ENDPOINT_PATTERN,
        desc="URL of an S3-compatible server (e.g. http://minio.storage:9000); empty: AWS S3 itself.",
    )
    region: str | None = fld(None, desc="The store's region (e.g. us-east-1); empty: the client's default.")
    credentials_secret: str | None = fld(
        None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        desc="A Secret in the job's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, handed to "
        "every pod that reads data or checkpoints as environment variables (the operator never reads it); "
        "empty: the pods' own credentials (e.g. a node role).",
    )
