"""Pods on the local cluster: the trainer image, ConfigMap/Secret plumbing, owner GC."""

from __future__ import annotations

from kubernetes import client


def test_trainer_image_imports_torch_and_logs_come_back(kube, namespace):
    code = "import torch, disttrain_trainer; print('trainer-image-ok', torch.__version__)"
    # More than the pod helper's default request: importing torch takes a few CPU-seconds, and
    # beside the other lane's busy pods a small share stretches that to minutes.
    requests = client.V1ResourceRequirements(requests={"cpu": "250m", "memory": "256Mi"})
    kube.core.create_namespaced_pod(namespace, kube.pod(
        "trainer", image=kube.trainer_image, command=["python", "-c", code], container={"resources": requests},
        security_context=client.V1PodSecurityContext(run_as_non_root=True)))
    kube.wait_phase(namespace, "trainer", ("Succeeded",), timeout=180)
    # read through the apiserver -> kubelet path, as `kubectl logs` does
    assert "trainer-image-ok 2.13.0" in kube.logs(namespace, "trainer")


def test_configmap_file_and_secret_env(kube, namespace):
    kube.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="cfg"), data={"greeting.txt": "hello from a configmap"}))
    kube.core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="sec"), string_data={"token": "s3cr3t-value"}))
    kube.core.create_namespaced_pod(namespace, kube.pod(
        "reader", command=["sh", "-c", 'cat /cfg/greeting.txt; echo; echo "secret=$TOKEN"'],
        volumes=[client.V1Volume(name="cfg", config_map=client.V1ConfigMapVolumeSource(name="cfg"))],
        container={
            "volume_mounts": [client.V1VolumeMount(name="cfg", mount_path="/cfg")],
            "env": [client.V1EnvVar(name="TOKEN", value_from=client.V1EnvVarSource(
                secret_key_ref=client.V1SecretKeySelector(name="sec", key="token")))],
        }))
    kube.wait_phase(namespace, "reader", ("Succeeded",))
    out = kube.logs(namespace, "reader")
    assert "hello from a configmap" in out
    assert "secret=s3cr3t-value" in out


def test_deleting_owner_garbage_collects_pods(kube, namespace):
    owner = kube.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="owner")))
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    for i in range(2):
        p = kube.pod(f"owned-{i}", command=["sleep", "3600"])
        p.metadata.owner_references = [ref]
        kube.core.create_namespaced_pod(namespace, p)
    # Running first: a pod deleted while its container is being created can stay Terminating
    # for minutes on the local cluster's 1.20 kubelets (volumes torn down under the starting
    # container, StartContainer fails, the pod worker does not come back to it). That race is
    # the kubelet's, not the garbage collector's that this test is about.
    for i in range(2):
        kube.wait_phase(namespace, f"owned-{i}", ("Running",))
    kube.core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    # Two steps, each with its own limit, so a failure says whose it is: the garbage
    # collector deletes the pods (deletionTimestamp set), then their kubelet stops them.
    def deleted() -> bool:
        return all(p.metadata.deletion_timestamp for p in kube.core.list_namespaced_pod(namespace).items)

    kube.wait(deleted, timeout=60, what="the garbage collector to delete the owned pods")

    def gone() -> bool:
        return not kube.core.list_namespaced_pod(namespace).items

    # Usually about 10 s. The 1.20 kubelet removes a deleted pod's sandbox on the PLEG event for
    # its removed container only if the pod's worker has already recorded the container's death;
    # when the worker is late (a busy host), the sandbox waits for the container garbage
    # collector, which runs once a minute (kubelet.ContainerGCPeriod), and the API object for the
    # status manager's next 10 s pass. The limit covers that path with room to spare.
    try:
        kube.wait(gone, timeout=150, what="the kubelets to stop the deleted pods")
    except AssertionError as e:
        raise AssertionError(f"{e}; still there:\n{kube.pods_report(namespace)}") from None
