"""Which Secrets a job's pods may mount, and when the operator must mint new ones (pure).

The operator creates Secrets but may not read them (RBAC: create only), so "already exists"
on a create tells it nothing about who made the Secret: a name it could have predicted
could have been taken first by anyone allowed to create Secrets in the namespace, with a
key they know. So every minted Secret gets a fresh random name
(topology.credentials.fresh_secret_name) and counts as the job's only once the API server
answered 201; its name is then recorded in the job's status (`status.secrets`), which is
what the pods mount, across operator restarts. Nothing else is ever mounted for it.

Order (crash-safe): decide() asks for the Secrets a gang needs before it plans the gang
(Plan.mint_secrets); the glue creates them and writes their names into the status in the
same reconcile; only a later reconcile, which reads them there, creates pods that mount
them. A crash between the create and the status write leaves a Secret nobody mounts (the
garbage collector deletes it with the job); the next reconcile mints another.

The TLS certificate is renewed the same way: once `renew_before_s` is left of its validity a
new TLS Secret is minted and the gang and its servers are recreated on it (see
`due`). A running server cannot take a new key pair in place without reloading it, and
its clients would have to trust two CAs meanwhile; a restart from the checkpoint costs a
few seconds once per validity period, and every pod then agrees on one CA.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from disttrain_api.model import FederatedSpec, JobSpec, ParamServerSpec

from .observe import format_time, parse_time
from .topology.credentials import IDENTITY, TLS

NOT_AFTER = "tlsNotAfter"  # status.secrets key of the TLS certificate's expiry


def needed(spec: JobSpec) -> tuple[str, ...]:
    """The purposes of the Secrets the operator mints for a job of this spec."""
    if spec.mode == "federated":
        fed = spec.federated or FederatedSpec()
        tls, user_named = fed.tls, fed.tls_secret_name
    elif spec.mode == "paramserver":
        ps = spec.param_server or ParamServerSpec()
        tls, user_named = ps.tls, ps.tls_secret_name
    else:
        return ()
    return (IDENTITY, TLS) if tls and not user_named else (IDENTITY,)


def recorded(status: dict[str, Any]) -> dict[str, str]:
    """purpose -> name of the Secrets the operator created for the job (status.secrets)."""
    found = status.get("secrets") or {}
    return {p: found[p] for p in (IDENTITY, TLS) if isinstance(found.get(p), str) and found[p]}


def renew_at(status: dict[str, Any], renew_before_s: float) -> datetime | None:
    """When the recorded TLS certificate must be replaced; None without one."""
    expires = parse_time((status.get("secrets") or {}).get(NOT_AFTER))
    return expires - timedelta(seconds=renew_before_s) if expires is not None else None


def due(spec: JobSpec, status: dict[str, Any], now: datetime, renew_before_s: float) -> tuple[str, ...]:
    """The Secrets to mint before the job's pods may be (re)created: those the spec needs and
    the status does not record (a new job, or one an operator before status.secrets created),
    and the TLS Secret once its certificate is within `renew_before_s` of expiring."""
    have = recorded(status)
    out = [p for p in needed(spec) if p not in have]
    if TLS in needed(spec) and TLS in have:
        at = renew_at(status, renew_before_s)
        if at is None or now >= at:
            out.append(TLS)
    return tuple(out)


def seconds_until_due(spec: JobSpec, status: dict[str, Any], now: datetime, renew_before_s: float) -> float | None:
    """Seconds until `due` turns non-empty by the clock alone; None when it never does."""
    if TLS not in needed(spec) or TLS not in recorded(status):
        return None
    at = renew_at(status, renew_before_s)
    return None if at is None else max((at - now).total_seconds(), 0.0)


def record(status: dict[str, Any], purpose: str, name: str, not_after: datetime | None = None) -> None:
    """Write a Secret the API server created for the job into `status` (the plan's)."""
    entry = dict(status.get("secrets") or {})
    entry[purpose] = name
    if purpose == TLS and not_after is not None:
        entry[NOT_AFTER] = format_time(not_after)
    status["secrets"] = entry
