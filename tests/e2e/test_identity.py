"""Identities on a cluster: what a compromised client pod can do with what the operator mounted.

One short federated job. Inside a real client pod (`kubectl exec`, as the trainer's user,
with the pod's own mounts) a small script finds only its own clients' credentials (no server
key, no other client's), presents its own token for another client's id, signs one with its
own credential for that id, and replays a token of a closed round and one of another
aggregator process: every call is refused, and the aggregator's rejection counter (read from
its metrics endpoint by the same pod) counts each by reason. The job's service account can
read no Secret, and the API server accepted the job's NetworkPolicies (this cluster's bridge
CNI does not enforce them; the README says which CNIs do).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from .conftest import Kubectl, OperatorProcess  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

# Runs in the client pod with the image's Python; imports nothing that pulls in torch, so it
# starts in about a second.
ATTACK = r'''
import asyncio, json, os, pathlib, re, sys, time, urllib.request
import grpc
from disttrain_trainer.tensor_transport import auth
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2_grpc as pbg

JOIN = "join"  # federated/bindings.py, without importing the federated package (torch)
round_binding = lambda r, a: f"{r}.{a}"
aggregator_ip, clients = sys.argv[1], int(sys.argv[2])
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
                                   "roundTimeoutSeconds": 10, "partition": {"kind": "iid"}}}}  # fmt: skip


def test_a_client_pod_can_neither_borrow_an_identity_nor_replay_a_token(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = f"ident-{uuid.uuid4().hex[:5]}"
    kubectl.apply(manifest(name, namespace))
    uid = kubectl.job(namespace, name)["metadata"]["uid"].replace("-", "")[:8]

    def running(role: str) -> dict[str, Any] | None:
        return next((p for p in kubectl.pods(namespace, name) if p["metadata"]["labels"].get("disttrain.dev/role") == role
                     and p["status"].get("phase") == "Running" and p["status"].get("podIP")), None)  # fmt: skip

    # A round done: the aggregator serves, and a closed round's tokens exist to be replayed.
    kubectl.wait_for("round 1", lambda: (kubectl.job(namespace, name).get("status") or {}).get("step", 0) >= 1,
                     timeout=400)  # fmt: skip
    aggregator = kubectl.wait_for("the aggregator running", lambda: running("aggregator"), timeout=60)
    client = kubectl.wait_for("a client pod running", lambda: running("client"), timeout=60)
    got = kubectl.run("exec", "-n", namespace, client["metadata"]["name"], "-c", "trainer", "--", "python", "-c",
                      ATTACK, aggregator["status"]["podIP"], "4", timeout=300)  # fmt: skip
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["mine"] in (["client-0", "client-2"], ["client-1", "client-3"]), out  # its own two clients, nothing else
    assert out["rounds done"] >= 1, out
    assert out["own token for another id"] == "UNAUTHENTICATED wrong_identity", out
    assert out["own credential signing for another id"] == "UNAUTHENTICATED wrong_identity", out
    assert out["replayed round"] == "expired_round" and out["replayed session"] == "expired_session", out
    rejected = out["rejected"]
    assert rejected.get("wrong_identity", 0) >= 2 and rejected.get("expired_round", 0) >= 1, rejected
    assert rejected.get("expired_session", 0) >= 1, rejected

    # The pods' service account reads no Secret (the pods do not even mount its token).
    sa = f"system:serviceaccount:{namespace}:default"
    for verb in ("get", "list", "watch"):
        can = kubectl.run("auth", "can-i", verb, "secrets", "-n", namespace, "--as", sa, check=False)
        assert can.stdout.strip() == "no", (verb, can.stdout, can.stderr)
    assert all(p["spec"].get("automountServiceAccountToken") is False for p in kubectl.pods(namespace, name))
    # The Secrets and NetworkPolicies the operator minted, accepted by the API server.
    secrets = kubectl.run("get", "secrets", "-n", namespace, "-l", f"disttrain.dev/job-name={name}", "-o", "name")
    assert sorted(secrets.stdout.split()) == [f"secret/{name}-identity-{uid}", f"secret/{name}-tls-{uid}"]
    policies = kubectl.json("get", "networkpolicies", "-n", namespace, "-l", f"disttrain.dev/job-name={name}")
    assert sorted(p["metadata"]["name"] for p in policies["items"]) == [f"{name}-aggregator-{uid}", f"{name}-gang-{uid}"]
    kubectl.run("delete", "disttrainjobs.disttrain.dev", name, "-n", namespace, "--wait=false")
