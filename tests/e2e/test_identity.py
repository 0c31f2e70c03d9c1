"""Identities on a cluster: what a compromised client pod can do with what the operator mounted,
and what someone who may create Secrets in the job's namespace can do before the job starts.

One short federated job, created suspended. Before it starts, an attacker who can read the job
(its UID) and create Secrets plants an identity Secret (a server key they know) and a TLS Secret
under the names the operator used to derive from the UID. The operator (one of this test's own,
minting certificates valid only 600 s) creates the job's Secrets under fresh names, records them
in the job's status and mounts only those. A second operator with the default settings then
takes over (the status is the record) and finds the certificate within its renewal margin: it
mints a new TLS Secret and recreates the gang and the aggregator on it, not counted as a restart.
Inside a real client pod (`kubectl exec`, as the trainer's user, with the pod's own mounts) a
small script finds only its own clients' credentials (no server key, no other client's),
presents a token made with the planted key, its own token for another client's id, signs one
with its own credential for that id, and replays a token of a closed round and one of another
aggregator process: every call is refused, and the aggregator's rejection counter (read from its
metrics endpoint by the same pod) counts each by reason. The job's service account can read no
Secret, and the API server accepted the job's NetworkPolicies (this cluster's bridge CNI does not
enforce them; the README says which CNIs do).
"""

from __future__ import annotations

import json
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from disttrain_api.identities import client_ids, credential
from disttrain_operator.topology.credentials import self_signed_server_cert, service_dns_names

from .conftest import Kubectl, OperatorProcess, wait_event  # type: ignore[import-not-found]

JOBS = "disttrainjobs.disttrain.dev"

pytestmark = pytest.mark.e2e

# Runs in the client pod with the image's Python; imports nothing that pulls in torch, so it
# starts in about a second.
ATTACK = r'''
import asyncio, hashlib, hmac, json, os, pathlib, re, sys, time, urllib.request
import grpc
from disttrain_trainer.tensor_transport import auth
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2_grpc as pbg

JOIN = "join"  # federated/bindings.py, without importing the federated package (torch)
round_binding = lambda r, a: f"{r}.{a}"
aggregator_ip, clients, planted_key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
folder = pathlib.Path(os.environ["DISTTRAIN_IDENTITY_DIR"])
mine = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".."))  # ..data: the volume's own links
width = len(str(clients - 1))
other = next(c for c in (f"client-{i:0{width}d}" for i in range(clients)) if c not in mine)
out = {"mine": mine, "other": other}
creds = auth.Credentials.load(folder, mine)
me = mine[0]

def refusal(e):
    return e.code().name + " " + next((v for k, v in e.trailing_metadata() or () if k == auth.REFUSAL_KEY), "")

async def main():
    target = os.environ["DISTTRAIN_SERVER_ADDR"]
    tls = os.environ.get("DISTTRAIN_TLS_DIR")
    if tls:
        ca = (pathlib.Path(tls) / "ca.crt").read_bytes()
        channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
    else:
        channel = grpc.aio.insecure_channel(target)
    stub = pbg.FederatedStub(channel)
    deadline = time.monotonic() + 240
    while True:  # until a round has closed (its tokens can then be replayed)
        try:
            joined = await stub.Join(pb.JoinRequest(client_ids=[me]), metadata=creds.metadata(me, "", JOIN))
        except grpc.aio.AioRpcError as e:  # not listening yet
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            joined = None
        if (joined is not None and joined.round >= 1) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    out["rounds done"] = joined.round

    async def join_as(label, md):
        try:
            await stub.Join(pb.JoinRequest(client_ids=[other]), metadata=md)
            out[label] = "OK"
        except grpc.aio.AioRpcError as e:
            out[label] = refusal(e)

    # A token made with the key the attacker planted (HMAC-derived as the operator derives credentials).
    planted = hmac.new(planted_key, b"disttrain-credential-v1\n" + me.encode(), hashlib.sha256).digest()
    try:
        await stub.Join(pb.JoinRequest(client_ids=[me]), metadata=(
            (auth.IDENTITY_KEY, me), (auth.SESSION_KEY, ""), (auth.BINDING_KEY, JOIN),
            (auth.TOKEN_KEY, auth.SCHEME + auth.token(planted, me, "", JOIN))))
        out["token from the planted key"] = "OK"
    except grpc.aio.AioRpcError as e:
        out["token from the planted key"] = refusal(e)

    relabelled = dict(creds.metadata(me, "", JOIN))
    relabelled[auth.IDENTITY_KEY] = other
    await join_as("own token for another id", tuple(relabelled.items()))
    cred = auth.read_key(folder / me)
    signed = ((auth.IDENTITY_KEY, other), (auth.SESSION_KEY, ""), (auth.BINDING_KEY, JOIN),
              (auth.TOKEN_KEY, auth.SCHEME + auth.token(cred, other, "", JOIN)))
    await join_as("own credential signing for another id", signed)
    update = [pb.Chunk(header=pb.StreamHeader(kind="update", round=1))]
    for label, session in (("replayed round", joined.session), ("replayed session", "0123456789abcdef")):
        reply = await stub.PushUpdate(iter(update), metadata=creds.metadata(me, session, round_binding(1, 1)))
        out[label] = "accepted" if reply.accepted else reply.reason.split(":", 1)[0]
    await channel.close()
    page = urllib.request.urlopen(f"http://{aggregator_ip}:{os.environ['DISTTRAIN_METRICS_PORT']}/metrics",
                                  timeout=10).read().decode()
    out["rejected"] = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^disttrain_federated_updates_rejected_total\{[^}]*reason="([a-z_]+)"[^}]*\} (\S+)$', page, re.M)}

asyncio.run(main())
print(json.dumps(out))
'''


def manifest(name: str, ns: str) -> dict[str, Any]:
    # Rounds enough to outlast the checks (the job is deleted after them), each a fraction of a second.
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": name, "namespace": ns},
            "spec": {"mode": "federated",
                     "workers": {"replicas": 2, "resources": {"cpu": "400m", "memory": "768Mi"}},
                     "model": {"name": "mlp", "hidden": 32, "layers": 1},
                     "data": {"name": "digits", "batchSize": 32},
                     "optimizer": {"name": "sgd", "lr": 0.05, "scaleLR": "none", "decay": "none"},
                     "federated": {"clients": 4, "clientsPerRound": 2, "minAnsweredClients": 1, "rounds": 2000,
                                   "roundTimeoutSeconds": 10, "partition": {"kind": "iid"}},
                     "runPolicy": {"suspend": True}}}  # fmt: skip


def plant(kubectl: Kubectl, ns: str, name: str, uid8: str) -> tuple[bytes, list[str]]:
    """The attacker's Secrets under the names derived from the job's UID: an identity Secret with a
    server key they know (and the credentials derived from it), and a TLS key pair of their own for
    the aggregator's names. Returns the key and the Secrets' names."""
    key = secrets.token_bytes(32)
    ca, cert, pem = self_signed_server_cert(service_dns_names(ns, f"{name}-aggregator"))
    identity = {"server.key": key.hex(), **{cid: credential(key, cid).hex() for cid in client_ids(4)}}
    docs = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-identity-{uid8}", "namespace": ns,
         "labels": {"disttrain.dev/job-name": name}}, "stringData": identity},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-tls-{uid8}", "namespace": ns,
         "labels": {"disttrain.dev/job-name": name}},
         "stringData": {"ca.crt": ca.decode(), "tls.crt": cert.decode(), "tls.key": pem.decode()}},
    ]  # fmt: skip
    for doc in docs:
        kubectl.apply(doc)
    return key, [d["metadata"]["name"] for d in docs]


def mounted_secrets(kubectl: Kubectl, ns: str, name: str) -> set[str]:
    """Every Secret a pod of the job or its aggregator's pod template mounts."""
    specs = [p["spec"] for p in kubectl.pods(ns, name)]
    specs += [d["spec"]["template"]["spec"] for d in kubectl.json(
        "get", "deployments", "-n", ns, "-l", f"disttrain.dev/job-name={name}")["items"]]  # fmt: skip
    return {v["secret"]["secretName"] for s in specs for v in s.get("volumes") or [] if "secret" in v}


def test_planted_secrets_are_never_used_and_a_client_pod_can_neither_borrow_an_identity_nor_replay_a_token(
    kubectl: Kubectl, crd: None, own_namespace: str, tmp_path: Path
) -> None:
    ns, name = own_namespace, f"ident-{uuid.uuid4().hex[:5]}"
    short = OperatorProcess(kubectl, [ns], tmp_path / "short.log",
                            env={"DISTTRAIN_OPERATOR_TLS_VALIDITY": "600", "DISTTRAIN_OPERATOR_TLS_RENEW_BEFORE": "1"})
    default = OperatorProcess(kubectl, [ns], tmp_path / "default.log")
    short.start()
    try:
        kubectl.apply(manifest(name, ns))
        uid8 = kubectl.job(ns, name)["metadata"]["uid"].replace("-", "")[:8]
        planted_key, planted = plant(kubectl, ns, name, uid8)
        kubectl.run("patch", JOBS, name, "-n", ns, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
        job = kubectl.wait_phase(ns, name, ("Running",), timeout=400)
        first, attempt = job["status"]["secrets"], job["status"]["attempt"]
        assert not {first["identity"], first["tls"]} & set(planted), first
        expires = datetime.strptime(first["tlsNotAfter"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert (expires - datetime.now(UTC)).total_seconds() <= 600, first  # the short validity
        assert mounted_secrets(kubectl, ns, name) == {first["identity"], first["tls"]}
    finally:
        short.stop()
        print(short.tail())
    default.start()  # 600 s left is inside the default 30 days' margin: renewed at once
    try:
        def renewed() -> dict[str, Any] | None:
            status = kubectl.job(ns, name).get("status") or {}
            return status if (status.get("secrets") or {}).get("tls") not in (None, first["tls"]) \
                and status.get("phase") == "Running" and status.get("step", 0) >= 1 else None

        status = kubectl.wait_for("the certificate renewed and a round done on it", renewed, timeout=400)
        second = status["secrets"]
        assert second["identity"] == first["identity"] and status["restarts"] == 0, status
        assert status["attempt"] == attempt + 1, status  # one gang recreated on the new Secret
        expires = datetime.strptime(second["tlsNotAfter"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert expires - datetime.now(UTC) > timedelta(days=300), second  # the default validity
        assert wait_event(kubectl, ns, name, "SecretsRenewed")["type"] == "Normal"
        check_a_client_pod(kubectl, ns, name, planted_key)
        # The old gang's pods mount the old certificate until they are gone (a busy host takes them a
        # while to terminate); no pod may keep it after that.
        renewed_only = {second["identity"], second["tls"]}
        mounted: list[set[str]] = []

        def only_renewed() -> bool:
            mounted.append(mounted_secrets(kubectl, ns, name))
            return mounted[-1] == renewed_only

        try:
            kubectl.wait_for("only the renewed Secrets mounted", only_renewed, timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}: mounted {sorted(mounted[-1])}, renewed {sorted(renewed_only)}") from None
    finally:
        kubectl.run("delete", JOBS, name, "-n", ns, "--wait=false", check=False)
        default.stop()
        print(default.tail())


def check_a_client_pod(kubectl: Kubectl, ns: str, name: str, planted_key: bytes) -> None:
    uid = kubectl.job(ns, name)["metadata"]["uid"].replace("-", "")[:8]

    def running(role: str) -> dict[str, Any] | None:
        """The newest running pod of `role` (an aggregator of the gang before the renewal may linger)."""
        pods = [p for p in kubectl.pods(ns, name) if p["metadata"]["labels"].get("disttrain.dev/role") == role
                and p["status"].get("phase") == "Running" and p["status"].get("podIP")
                and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        return max(pods, key=lambda p: p["metadata"]["creationTimestamp"], default=None)

    aggregator = kubectl.wait_for("the aggregator running", lambda: running("aggregator"), timeout=60)
    client = kubectl.wait_for("a client pod running", lambda: running("client"), timeout=60)
    got = kubectl.run("exec", "-n", ns, client["metadata"]["name"], "-c", "trainer", "--", "python", "-c",
                      ATTACK, aggregator["status"]["podIP"], "4", planted_key.hex(), timeout=300)  # fmt: skip
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["mine"] in (["client-0", "client-2"], ["client-1", "client-3"]), out  # its own two clients, nothing else
    assert out["rounds done"] >= 1, out
    assert out["token from the planted key"] == "UNAUTHENTICATED bad_token", out  # the planted key is not the job's
    assert out["own token for another id"] == "UNAUTHENTICATED wrong_identity", out
    assert out["own credential signing for another id"] == "UNAUTHENTICATED wrong_identity", out
    assert out["replayed round"] == "expired_round" and out["replayed session"] == "expired_session", out
    rejected = out["rejected"]
    assert rejected.get("bad_token", 0) >= 1 and rejected.get("wrong_identity", 0) >= 2, rejected
    assert rejected.get("expired_round", 0) >= 1 and rejected.get("expired_session", 0) >= 1, rejected

    # The pods' service account reads no Secret (the pods do not even mount its token).
    sa = f"system:serviceaccount:{ns}:default"
    for verb in ("get", "list", "watch"):
        can = kubectl.run("auth", "can-i", verb, "secrets", "-n", ns, "--as", sa, check=False)
        assert can.stdout.strip() == "no", (verb, can.stdout, can.stderr)
    assert all(p["spec"].get("automountServiceAccountToken") is False for p in kubectl.pods(ns, name))
    # The NetworkPolicies the operator created, accepted by the API server.
    policies = kubectl.json("get", "networkpolicies", "-n", ns, "-l", f"disttrain.dev/job-name={name}")
    assert sorted(p["metadata"]["name"] for p in policies["items"]) == [f"{name}-aggregator-{uid}", f"{name}-gang-{uid}"]
