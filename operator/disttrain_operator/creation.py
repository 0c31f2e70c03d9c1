"""Creating a job's children, and telling which existing objects are its own.

An object is the job's only when its controller owner reference carries the job's UID.
409 (AlreadyExists) on a create is expected after a crash or a lagging cache, and then:
- the job's own object is kept (its ConfigMap replaced: a re-created gang may run at a new
  size);
- one controlled by an earlier job with the same name (another UID) is being deleted with
  its owner by the garbage collector: the job waits for it;
- a checkpoint claim without an owner that carries the job's label was kept by an earlier
  job of this name (`checkpoint.retain`): the job mounts it and resumes from its checkpoints;
- anything else (an orphan, another owner's object, a user's Helm-managed Service) is a
  NameConflict: the operator never touches it, the job waits until the name is free.
Secrets and NetworkPolicies are the exception: the operator may only create them (it can
read none), so a 409 cannot be sorted. A Secret is the job's only when this create answered
201 (`Outcome.created`): the reconciler records its name in the job's status and mounts
nothing else (job_secrets.py), so a Secret someone else created first is never used. A
NetworkPolicy's name carries the job's UID (topology.common.minted_name); a 409 there is
left as it is: whoever could create it could as well add a policy opening the job's pods.

Every other 4xx answer to a create (422 Invalid, 403 Forbidden by a quota or an admission
policy, 400) is the API server rejecting the object: reported with its message, never
raised as an error to retry in silence. Server errors (5xx, timeouts) are raised: the work
queue retries them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from disttrain_api.model import KIND

from . import topology
from .decide import name_conflict
from .kube import Kube, KubeError
from .observe import controller_of
from .topology import checkpoint_claim

# Answers to a create that say nothing about the object itself: retried as errors.
TRANSIENT = (401, 404, 408, 429)
# Created and never read back (RBAC: create only): a 409 says nothing about whose it is.
MINTED_KINDS = ("Secret", "NetworkPolicy")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What stopped the creation of a job's children (all empty: everything exists now)."""

    conflicts: list[str] = field(default_factory=list)  # objects holding our names (NameConflict)
    waiting: list[str] = field(default_factory=list)  # an earlier job's objects the garbage collector deletes
    rejected: list[str] = field(default_factory=list)  # the API server's refusals, with its message
    created: list[str] = field(default_factory=list)  # names of the objects this call created (201)
    # Secrets and NetworkPolicies that existed already (409): whose, nobody here can tell.
    existing: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not (self.conflicts or self.waiting or self.rejected)


def describe(obj: dict[str, Any]) -> str:
    return f"{obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']}"


def rejected(err: KubeError) -> bool:
    return 400 <= err.status < 500 and err.status not in (409, *TRANSIENT)


def _attempt(kube: Kube, obj: dict[str, Any]) -> dict[str, Any] | None | KubeError:
    """The created object, None when the name is taken, or the API server's rejection."""
    try:
        return kube.create(obj)
    except KubeError as err:
        if rejected(err):
            return err
        raise


def _existing(kube: Kube, obj: dict[str, Any], uid: str, job: str, out: Outcome) -> None:
    """Sort an object whose name was taken (409) into ours, an earlier job's, or a conflict."""
    if obj["kind"] in MINTED_KINDS:
        out.existing.append(obj["metadata"]["name"])  # cannot be read; a Secret is the job's only when created
        return
    live = kube.get(obj)
    if live is None:
        out.waiting.append(f"{describe(obj)} (deleted meanwhile)")
        return
    owner = controller_of(live) or {}
    if checkpoint_claim.retained_by(live, job):
        return  # kept by an earlier job of this name (checkpoint.retain): its checkpoints are this job's
    if owner.get("uid") == uid:
        if obj["kind"] == "ConfigMap" and not kube.replace(obj, live["metadata"]["resourceVersion"]):
            out.waiting.append(f"{describe(obj)} (changed while being replaced)")
        return
    if owner.get("kind") == KIND and owner.get("name") == job:
        out.waiting.append(describe(obj))
        return
    out.conflicts.append(name_conflict(describe(obj), owner.get("kind", ""), owner.get("name", "")))


def _create_all(kube: Kube, objs: list[dict[str, Any]], uid: str, job: str, out: Outcome) -> None:
    for obj, result in zip(objs, kube.each(lambda o: _attempt(kube, o), objs), strict=True):
        if isinstance(result, KubeError):
            reason = f" {result.reason}" if result.reason else ""
            out.rejected.append(f"{describe(obj)}: HTTP {result.status}{reason}: {result.message}")
        elif result is None:
            _existing(kube, obj, uid, job, out)
        else:
            out.created.append(obj["metadata"]["name"])


def create_children(kube: Kube, children: topology.Children, job: dict[str, Any]) -> Outcome:
    """Create the job's children: first every object the pods refer to at once, then every
    pod at once (only when the former all exist). Pods created before another pod was
    refused stay: the next try creates the rest."""
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    out = Outcome()
    support = [*children.secrets, *children.network_policies, *children.claims, *children.config_maps,
               *children.services, *children.deployments]  # fmt: skip
    _create_all(kube, support, uid, name, out)
    if out.done:
        _create_all(kube, children.pods, uid, name, out)
    return out


def delete_servers(kube: Kube, spec: Any, job: dict[str, Any]) -> None:
    """Delete the job's server Deployments (federated aggregator, parameter-server shards),
    one by one by name, each only when this job controls it (a UID precondition on the
    delete: never a same-named successor)."""
    meta = job["metadata"]
    probes = [{"kind": "Deployment", "metadata": {"namespace": meta["namespace"], "name": n}}
              for n in topology.server_deployments(spec, meta["name"])]
    for probe, live in zip(probes, kube.each(kube.get, probes), strict=True):
        if live is None or live["metadata"].get("deletionTimestamp"):
            continue
        if (controller_of(live) or {}).get("uid") == meta["uid"]:
            kube.delete_exact(probe, live["metadata"]["uid"])
