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
        desc="A Secret in the job's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, handed as "
        "environment variables to the pods that write checkpoints (workers, the federated aggregator, "
        "parameter servers and worker 0) and, without checkpoint.uri, to every pod (the operator never reads "
        "it); empty: the pods' own credentials (e.g. a node role).",
    )
    data_credentials_secret: str | None = fld(
        None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        desc="A Secret like credentialsSecret, for the pods that only read data (federated clients, "
        "parameter-server workers but worker 0): give it read access to data.path only. With checkpoint.uri "
        "these pods never get credentialsSecret, so without this Secret they use their own credentials.",
    )
