"""Builders of the channel security of the federated and parameter-server modes, without a cluster:
the TLS and identity Secrets, what each pod mounts of them, and the NetworkPolicies."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography import x509
from disttrain_api import constants as c
from disttrain_api import model as api
from disttrain_api.identities import SERVER_KEY, client_ids, credential
from disttrain_operator.topology import BUILDERS, build_children
from disttrain_operator.topology.common import BuildContext
from disttrain_operator.topology.credentials import (
    CA_FILE,
    CERT_FILE,
    IDENTITY_VOLUME,
    KEY_FILE,
    TLS_VOLUME,
)

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def spec(**over: Any) -> api.JobSpec:
    base: dict[str, Any] = {"mode": "federated", "workers": {"replicas": 2}}
    base.update(over)
    return api.parse_spec(base)


def ctx(**over: Any) -> BuildContext:
    values: dict[str, Any] = {"name": "job1", "namespace": "ns1", "uid": UID, "image": "img:1", "replicas": 2}
    values.update(over)
    return BuildContext(**values)


def data_of(secret: dict[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def volumes_of(pod_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec["volumes"]}


def env_of(pod_spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod_spec["containers"][0]["env"]}


def pod_specs(children: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return [d["spec"]["template"]["spec"] for d in children.deployments], [p["spec"] for p in children.pods]


def test_secrets_are_named_with_the_jobs_uid_and_created_before_anything_that_mounts_them() -> None:
    children = build_children(spec(), ctx())
    names = [s["metadata"]["name"] for s in children.secrets]
    assert names == ["job1-tls-0f1e2d3c", "job1-identity-0f1e2d3c"]
    first = children.all()[: len(names) + len(children.network_policies)]
    assert first == [*children.secrets, *children.network_policies]
    named = build_children(spec(federated={"tlsSecretName": "mine"}), ctx())
    assert [s["metadata"]["name"] for s in named.secrets] == ["job1-identity-0f1e2d3c"]  # identities: always minted
    servers, clients = pod_specs(named)
    assert volumes_of(servers[0])[TLS_VOLUME]["secret"]["secretName"] == "mine"
    assert volumes_of(clients[0])[TLS_VOLUME]["secret"]["secretName"] == "mine"
    plain = build_children(spec(federated={"tls": False}), ctx())
    assert [s["metadata"]["name"] for s in plain.secrets] == ["job1-identity-0f1e2d3c"]
    assert all(TLS_VOLUME not in volumes_of(p) and c.ENV_TLS_DIR not in env_of(p) for p in sum(pod_specs(plain), []))


def test_every_credential_derives_from_the_server_key_and_only_the_servers_mount_that_key() -> None:
    children = build_children(spec(federated={"clients": 7, "clientsPerRound": 3}, workers={"replicas": 3}),
                              ctx(replicas=3))  # fmt: skip
    identity = data_of(children.secrets[1])
    key = bytes.fromhex(identity[SERVER_KEY].decode())
    assert set(identity) == {SERVER_KEY, *client_ids(7)}
    for cid in client_ids(7):
        assert identity[cid].decode() == credential(key, cid).hex()
    servers, clients = pod_specs(children)
    (server,) = servers
    assert volumes_of(server)[IDENTITY_VOLUME]["secret"]["items"] == [{"key": SERVER_KEY, "path": SERVER_KEY}]
    assert env_of(server)[c.ENV_IDENTITY_DIR] == c.IDENTITY_MOUNT_DIR
    mounted: list[str] = []
    for index, pod in enumerate(clients):
        items = [i["key"] for i in volumes_of(pod)[IDENTITY_VOLUME]["secret"]["items"]]
        assert items == client_ids(7)[index::3]  # round-robin, as the trainer's processes host them
        assert SERVER_KEY not in items
        mounted += items
    assert sorted(mounted) == client_ids(7)  # each credential in exactly one pod


def test_a_pod_with_several_processes_mounts_the_clients_of_all_of_them() -> None:
    s = spec(federated={"clients": 10, "clientsPerRound": 3}, workers={"replicas": 2, "procsPerWorker": 2})
    _, clients = pod_specs(build_children(s, ctx()))
    ids = client_ids(10)
    first = [i["key"] for i in volumes_of(clients[0])[IDENTITY_VOLUME]["secret"]["items"]]
    assert first == sorted(ids[0::4] + ids[1::4])  # ranks 0 and 1 of world 4


def test_a_pod_that_hosts_no_client_mounts_no_credential() -> None:
    # An empty `items` would project every key of the Secret, the server key included.
    _, clients = pod_specs(build_children(spec(federated={"clients": 2, "clientsPerRound": 2},
                                               workers={"replicas": 3}), ctx(replicas=3)))  # fmt: skip
    assert IDENTITY_VOLUME not in volumes_of(clients[2])
    for pod in clients:
        for v in pod["volumes"]:
            if "secret" in v:
                assert v["secret"].get("items"), v


def test_paramserver_workers_get_their_own_credential_and_shards_share_one_certificate() -> None:
    s = api.parse_spec({"mode": "paramserver", "workers": {"replicas": 2}, "paramServer": {"shards": 2},
                        "elastic": {"minReplicas": 1, "maxReplicas": 4}})  # fmt: skip
    children = build_children(s, ctx())
    tls, identity = children.secrets
    # Minted for every worker the elastic gang may ever have.
    assert set(data_of(identity)) == {SERVER_KEY, "worker-0", "worker-1", "worker-2", "worker-3"}
    servers, workers = pod_specs(children)
    assert len(servers) == 2
    for index, pod in enumerate(workers):
        assert volumes_of(pod)[IDENTITY_VOLUME]["secret"]["items"] == [{"key": f"worker-{index}", "path": f"worker-{index}"}]
        assert volumes_of(pod)[TLS_VOLUME]["secret"]["items"] == [{"key": CA_FILE, "path": CA_FILE}]
    cert = x509.load_pem_x509_certificate(data_of(tls)[CERT_FILE])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    for dep in children.deployments:
        addrs = env_of(dep["spec"]["template"]["spec"])[c.ENV_SERVER_ADDR].split(",")
        assert all(a.rsplit(":", 1)[0] in sans for a in addrs)  # workers dial each shard by a name it holds
        assert volumes_of(dep["spec"]["template"]["spec"])[TLS_VOLUME]["secret"].get("items") is None


def test_the_server_certificate_is_issued_by_the_ca_for_the_service_names() -> None:
    children = build_children(spec(), ctx())
    tls = data_of(children.secrets[0])
    assert set(tls) == {CA_FILE, CERT_FILE, KEY_FILE}
    cert = x509.load_pem_x509_certificate(tls[CERT_FILE])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(tls[CA_FILE]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    (dep,) = children.deployments
    server = env_of(dep["spec"]["template"]["spec"])[c.ENV_SERVER_ADDR]
    assert server.rsplit(":", 1)[0] in names  # clients dial the Service by this name and verify it


def test_the_certificate_holds_names_longer_than_a_common_name() -> None:
    name, ns = "j" * 50, "n" * 50  # legal names whose Service FQDN is far longer than 64 characters
    children = build_children(spec(), ctx(name=name, namespace=ns))
    cert = x509.load_pem_x509_certificate(data_of(children.secrets[0])[CERT_FILE])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{name}-aggregator.{ns}.svc.cluster.local" in sans


def test_env_the_user_set_is_never_overridden() -> None:
    s = spec(workers={"replicas": 2, "template": {"env": [{"name": c.ENV_IDENTITY_DIR, "value": "/mine"}]}})
    _, clients = pod_specs(build_children(s, ctx()))
    assert env_of(clients[0])[c.ENV_IDENTITY_DIR] == "/mine"


@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_every_mode_lets_only_the_jobs_pods_reach_its_gang_and_anyone_its_metrics(mode: str) -> None:
    over: dict[str, Any] = {"mode": mode, "workers": {"replicas": 2, "procsPerWorker": 1 if mode == "paramserver" else 2}}
    if mode in ("tensor", "hybrid"):
        over.update(parallelism={"tensor": 2, "pipeline": 2 if mode == "hybrid" else 1},
                    model={"name": "gpt", "hidden": 64, "heads": 4, "layers": 4}, data={"name": "pytext"})
    if mode == "pipeline":
        over.update(parallelism={"pipeline": 2})
    s = api.parse_spec(over)
    children = build_children(s, ctx())
    gang = children.network_policies[0]
    assert gang["apiVersion"] == "networking.k8s.io/v1" and gang["metadata"]["name"] == "job1-gang-0f1e2d3c"
    role = children.pods[0]["metadata"]["labels"][c.LABEL_ROLE]
    assert gang["spec"]["podSelector"] == {"matchLabels": {c.LABEL_JOB: "job1", c.LABEL_ROLE: role}}
    assert gang["spec"]["policyTypes"] == ["Ingress"]
    from_job, metrics = gang["spec"]["ingress"]
    # Every port (the rendezvous port and the ranks' own) from the job's pods of this namespace only.
    assert from_job == {"from": [{"podSelector": {"matchLabels": {c.LABEL_JOB: "job1"}}}]}
    assert "namespaceSelector" not in str(gang) and "ipBlock" not in str(gang)
    nproc = s.workers.procs_per_worker
    assert metrics == {"ports": [{"protocol": "TCP", "port": s.metrics.port + i} for i in range(nproc)]}
    selected = {p["metadata"]["name"] for p in children.pods
                if all(p["metadata"]["labels"].get(k) == v for k, v in gang["spec"]["podSelector"]["matchLabels"].items())}
    assert selected == {p["metadata"]["name"] for p in children.pods}


@pytest.mark.parametrize(("mode", "role", "gang_role", "port"), [("federated", c.ROLE_AGGREGATOR, c.ROLE_CLIENT, 50051),
                                                                ("paramserver", c.ROLE_SERVER, c.ROLE_WORKER, 50052)])
def test_only_the_jobs_gang_reaches_the_servers_grpc_port(mode: str, role: str, gang_role: str, port: int) -> None:
    s = api.parse_spec({"mode": mode, "workers": {"replicas": 2}})
    children = build_children(s, ctx())
    (_, server) = children.network_policies
    assert server["metadata"]["name"] == f"job1-{role}-0f1e2d3c"
    assert server["spec"]["podSelector"] == {"matchLabels": {c.LABEL_JOB: "job1", c.LABEL_ROLE: role}}
    grpc_rule, metrics = server["spec"]["ingress"]
    assert grpc_rule == {"from": [{"podSelector": {"matchLabels": {c.LABEL_JOB: "job1", c.LABEL_ROLE: gang_role}}}],
                         "ports": [{"protocol": "TCP", "port": port}]}  # fmt: skip
    assert metrics == {"ports": [{"protocol": "TCP", "port": s.metrics.port}]}
    # The policy selects the server pods the Deployments make.
    for dep in children.deployments:
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in server["spec"]["podSelector"]["matchLabels"].items())


def test_minted_names_without_a_uid_have_no_suffix() -> None:
    children = build_children(spec(), ctx(uid=""))
    assert [s["metadata"]["name"] for s in children.secrets] == ["job1-tls", "job1-identity"]
