"""LocalCluster: bring-up, tear-down, leftovers of killed runs, and fault injection."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import controlplane, images, network, node, probes, volumewatch
from .config import APISERVER_PORT, BRIDGE_IP, CHECKPOINT_DIR, REPO_ROOT, ClusterConfig, NodeConfig
from .proc import (
    ClusterError,
    ensure_cgroup,
    join_cpu_cgroup,
    kill_cgroup,
    locked,
    remove_cgroups,
    run,
    say,
    wait_for,
)


def bin_dir() -> Path:
    """Build (or find) the Kubernetes binaries; cached, so this is instant after the first time."""
    res = subprocess.run([str(REPO_ROOT / "hack" / "build-k8s.sh")], capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError("binaries", f"hack/build-k8s.sh failed: {res.stderr.strip()[-800:]}")
    return Path(res.stdout.strip().splitlines()[-1])


class ContainerGone(ClusterError):
    """The container to kill had already exited (its pod is being replaced or just failed)."""


class LocalCluster:
    def __init__(self, cfg: ClusterConfig | None = None) -> None:
        self.cfg = cfg or ClusterConfig.from_env()
        # nvidia.com/gpu per node; set_node_gpus changes it, and start_node/wait_ready re-apply it
        # (a kubelet that re-registers may zero extended resources).
        self.gpus = {n.name: n.gpus for n in self.cfg.nodes}

    # --- what tests use ----------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.cfg.kubeconfig

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.cfg.nodes]

    @classmethod
    def current(cls) -> LocalCluster:
        """The cluster as last brought up (node count and GPUs from its state file)."""
        cfg = ClusterConfig.from_env()
        state = cfg.root / "cluster.json"
        if state.exists():
            d = json.loads(state.read_text())
            cfg = ClusterConfig(nodes=tuple(NodeConfig(index=n["index"], gpus=n["gpus"]) for n in d["nodes"]))
        return cls(cfg)

    def is_up(self) -> bool:
        """Up = apiserver ready, every node Ready (a stopped node still counts as part of it)."""
        if not self.cfg.kubeconfig.exists():
            return False
        res = run(["kubectl", f"--kubeconfig={self.cfg.kubeconfig}", "get", "nodes", "-o", "json",
                   "--request-timeout=5s"], step="status", check=False, timeout=15)
        if res.returncode != 0:
            return False
        names = {i["metadata"]["name"] for i in json.loads(res.stdout)["items"]}
        return names == set(self.node_names)

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return locked(self.cfg.root.parent / "cluster.lock")

    def ensure_up(self) -> bool:
        """Reuse a running cluster (bringing its images up to date) or start one; True if started."""
        with self.lock():
            if self.is_up():
                # A cluster started by an older version gets the CPU weights of this one.
                ensure_cgroup("")
                for rel in (controlplane.CGROUP, *(node.system_cgroup(n) for n in self.cfg.nodes)):
                    join_cpu_cgroup(rel)
                self.ensure_volumes()
                self.ensure_kubelets()
                self.refresh_images()
                return False
            self._up()
            return True

    def up(self) -> float:
        with self.lock():
            return self._up()

    def _up(self) -> float:
        try:
            return self._bring_up()
        except BaseException:
            say(f"bring-up failed; stopping what started (logs stay in {self.cfg.logs})")
            self.cleanup()
            raise

    def _bring_up(self) -> float:
        t0 = time.monotonic()
        cfg = self.cfg
        bins = bin_dir()
        node.check_binaries(bins)
        say("clearing leftovers of earlier runs")
        self.cleanup()
        for d in (cfg.logs, cfg.run):
            d.mkdir(parents=True, exist_ok=True)
        CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
        CHECKPOINT_DIR.chmod(0o1777)
        archives = images.ensure_all(bins)  # no-op when inputs are unchanged
        images.check_disk(cfg, archives)
        say("network: bridge, namespaces, routes")
        network.setup_host(cfg)
        from . import pki

        pki.make_pki(cfg)
        pki.write_tokens_and_kubeconfigs(cfg)
        self._save_state()
        for n in cfg.nodes:
            network.setup_node(cfg, n)
            node.write_configs(cfg, n, bins)
            node.ensure_mountns(cfg, n)
        say("etcd + kube-apiserver")
        controlplane.start_etcd(cfg)
        # Nodes' containerd (and image imports) start while the apiserver comes up.
        with ThreadPoolExecutor(max_workers=len(cfg.nodes) + 1) as pool:
            api = pool.submit(controlplane.start_apiserver, cfg, bins)
            futs = [pool.submit(self._start_runtime, n, archives) for n in cfg.nodes]
            api.result()
            for f in futs:
                f.result()
        say("DNS, kubelets, kube-proxies")
        self._post_apiserver()
        controlplane.start_dns(cfg)
        controlplane.start_volume_watch(cfg)
        for n in cfg.nodes:
            node.start_kubelet_and_proxy(cfg, n, bins)
        # The controller-manager starts once nodes are Ready: started earlier, it sees every node
        # NotReady, enters "master disruption mode", and afterwards may never taint a lost node
        # NoExecute (observed with v1.20.2), so node-loss evictions would not happen.
        self.wait_ready(controllers=False)
        say("controller-manager, scheduler")
        controlplane.start_controllers(cfg, bins)
        self.wait_ready()
        # The process runs; wait until its controllers act (see probes.py).
        probes.controllers_work(self.kubectl, self.node_names, timeout=cfg.ready_timeout_s)
        took = time.monotonic() - t0
        say(f"up in {took:.1f}s; nodes {', '.join(self.node_names)}")
        say(f"KUBECONFIG={cfg.kubeconfig}")
        return took

    def _save_state(self) -> None:
        nodes = [{"index": n.index, "gpus": self.gpus[n.name], "name": n.name} for n in self.cfg.nodes]
        (self.cfg.root / "cluster.json").write_text(json.dumps({"nodes": nodes}))

    def _start_runtime(self, n: NodeConfig, archives: dict[str, images.Archive]) -> None:
        node.start_runtime(self.cfg, n)
        if images.import_into(self.cfg, n, archives):
            # containerd's CRI image cache keeps the old image behind a re-used name until restart
            self._restart_containerd(n)

    def _restart_containerd(self, n: NodeConfig) -> None:
        node.restart_containerd(self.cfg, n)

    def ensure_volumes(self) -> None:
        """Dynamic volumes on a running cluster that an older version of this code brought up:
        the default StorageClass, the volume watcher, and a controller-manager with the hostPath
        provisioner (restarted with it; then its controllers are waited for as at bring-up)."""
        self.kubectl("apply", "-f", "-", input=json.dumps(volumewatch.STORAGE_CLASS_OBJECT))
        if not controlplane.running("volumewatch"):
            controlplane.start_volume_watch(self.cfg)
        if controlplane.HOSTPATH_PROVISIONER not in controlplane.controller_manager_flags():
            say("restarting kube-controller-manager with the hostPath provisioner")
            controlplane.stop_controller_manager()
            controlplane.start_controller_manager(self.cfg, bin_dir())
            probes.controllers_work(self.kubectl, self.node_names, timeout=self.cfg.ready_timeout_s)

    def ensure_kubelets(self) -> None:
        """Nodes of a running cluster whose kubelet was built otherwise (another set of
        hack/k8s-patches, e.g. by an older checkout) are restarted with this checkout's, one at a
        time: their pods end, as on any node restart."""
        want = (bin_dir() / "kubelet").resolve()
        for n in self.cfg.nodes:
            running = node.kubelet_binary(n)
            if running is not None and running != want:
                say(f"restarting {n.name}: its kubelet is {running}, this checkout builds {want}")
                self.start_node(n.name)

    def refresh_images(self) -> None:
        """Rebuild images whose inputs changed and import them into every node of a running cluster."""
        archives = images.ensure_all(bin_dir())
        images.check_disk(self.cfg, archives)
        with ThreadPoolExecutor(max_workers=len(self.cfg.nodes)) as pool:
            changed = list(pool.map(lambda n: images.import_into(self.cfg, n, archives), self.cfg.nodes))
        for n, did in zip(self.cfg.nodes, changed, strict=True):
            if did:
                node.restart_containerd(self.cfg, n)
                # one node at a time: all nodes NotReady at once puts the node controller in
                # "master disruption mode" (see up())
                self.wait_ready()

    def _post_apiserver(self) -> None:
        # --endpoint-reconciler-type=none: point the `kubernetes` Service at the bridge address,
        # which pods reach through their node's default route (in-cluster clients, the operator).
        ep = {"apiVersion": "v1", "kind": "Endpoints",
              "metadata": {"name": "kubernetes", "namespace": "default"},
              "subsets": [{"addresses": [{"ip": BRIDGE_IP}],
                           "ports": [{"name": "https", "port": APISERVER_PORT, "protocol": "TCP"}]}]}
        wait_for("the kubernetes Service",
                 lambda: self.kubectl("get", "service", "kubernetes", check=False).returncode == 0,
                 timeout=30, step="kubernetes service", log=self.cfg.logs / "kube-apiserver.log")
        self.kubectl("apply", "-f", "-", input=json.dumps(ep))
        # Before any claim: a claim created while no StorageClass is the default never gets one.
        self.kubectl("apply", "-f", "-", input=json.dumps(volumewatch.STORAGE_CLASS_OBJECT))

    def wait_ready(self, *, controllers: bool = True) -> None:
        """All nodes Ready with their GPUs advertised; with `controllers`, also the default
        ServiceAccount's token (pods cannot be created before it)."""
        cfg = self.cfg

        def ready() -> bool:
            res = self.kubectl("get", "nodes", "-o", "json", check=False)
            if res.returncode != 0:
                return False
            items = {i["metadata"]["name"]: i for i in json.loads(res.stdout)["items"]}
            for n in cfg.nodes:
                it = items.get(n.name)
                if it is None:
                    return False
                conds = {c["type"]: c["status"] for c in it["status"].get("conditions", [])}
                if conds.get("Ready") != "True":
                    return False
                # A (re)started node is Ready before the node controller lifts its `not-ready` or
                # `unreachable` taint (its next pass): until then nothing new is scheduled there.
                if controllers and any(t.get("key", "").startswith("node.kubernetes.io/")
                                       for t in it["spec"].get("taints") or []):
                    return False
                want = self.gpus[n.name]
                if str(it["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) != str(want):
                    self.set_node_gpus(n.name, want)
                    return False
            if not controllers:
                return True
            sa = self.kubectl("get", "serviceaccount", "default", "-o", "jsonpath={.secrets[0].name}", check=False)
            return sa.returncode == 0 and sa.stdout.strip() != ""

        wait_for("all nodes Ready (and the default ServiceAccount)", ready, timeout=cfg.ready_timeout_s,
                 step="nodes ready", log=cfg.logs / f"{cfg.nodes[0].name}-kubelet.log")

    def down(self) -> None:
        say("stopping and cleaning the local cluster")
        with self.lock():
            self.cleanup()
        say("down")

    def cleanup(self) -> None:
        """Stop everything and remove all state a run leaves (also a killed one), keeping only
        caches: binaries, image archives and each node's containerd image store."""
        kill_cgroup("")
        for name in network.list_netns():
            node.release_mountns(self.cfg, name)
        for name in list(Path(node.MNT_ROOT).glob("*")) if node.MNT_ROOT.exists() else []:
            node.release_mountns(self.cfg, name.name)
        run(["umount", "-l", node.MNT_ROOT], step="cleanup", check=False)
        remove_cgroups("")
        network.cleanup(self.cfg)
        shutil.rmtree("/run/disttrain", ignore_errors=True)
        shutil.rmtree(controlplane.ETCD_DATA, ignore_errors=True)
        # Dynamically provisioned volumes: their PersistentVolumes went with etcd.
        shutil.rmtree(volumewatch.VOLUMES_DIR, ignore_errors=True)
        for sub in ("nodes", "etcd", "dns", "run"):
            shutil.rmtree(self.cfg.root / sub, ignore_errors=True)
        (self.cfg.root / "cluster.json").unlink(missing_ok=True)

    # --- fault injection ---------------------------------------------------------------
    def kill_pod_container(self, namespace: str, pod: str, container: str | None = None) -> int:
        """kill -9 the main process of a pod's container (found through the runtime); returns its pid."""
        res = self.kubectl("get", "pod", "-n", namespace, pod, "-o", "json")
        obj = json.loads(res.stdout)
        n = self.cfg.node(obj["spec"]["nodeName"])
        statuses = obj["status"].get("containerStatuses", [])
        st = next((s for s in statuses if container in (None, s["name"])), None)
        if st is None or "containerID" not in st:
            raise ContainerGone("kill", f"pod {namespace}/{pod} has no running container {container or ''}")
        cid = st["containerID"].split("://", 1)[1]
        info = run(node.ctr(self.cfg, n, "task", "ls"), step="kill").stdout
        for line in info.splitlines():
            parts = line.split()
            if parts and parts[0] == cid:
                pid = int(parts[1])
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # exited between the listing and the kill
                    break
                return pid
        tasks = " | ".join(line for line in info.splitlines() if line.strip())
        raise ContainerGone("kill", f"container {cid[:12]} of {namespace}/{pod} has no running task on {n.name} "
                                    f"(tasks there: {tasks or 'none'})")

    def stop_node(self, name: str) -> None:
        """The node dies: kubelet, kube-proxy, containerd, shims and containers are SIGKILLed."""
        node.stop(self.cfg, self.cfg.node(name))

    def start_node(self, name: str) -> None:
        n = self.cfg.node(name)
        bins = bin_dir()
        node.stop(self.cfg, n)
        node.start_runtime(self.cfg, n)
        node.start_kubelet_and_proxy(self.cfg, n, bins)
        self.wait_ready()

    def set_node_gpus(self, name: str, count: int) -> None:
        """Advertise `count` nvidia.com/gpu on a node (extended resource via a status patch)."""
        self.cfg.node(name)
        self.gpus[name] = count
        self._save_state()
        patch = [{"op": "add", "path": f"/status/{f}/nvidia.com~1gpu", "value": str(count)}
                 for f in ("capacity", "allocatable")]
        token = controlplane._admin_token(self.cfg)
        # A plain REST call: no dependency on the kubectl version's --subresource support.
        req = urllib.request.Request(
            f"https://{BRIDGE_IP}:{APISERVER_PORT}/api/v1/nodes/{name}/status",
            data=json.dumps(patch).encode(), method="PATCH",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json-patch+json"})
        ctx = ssl.create_default_context(cafile=str(self.cfg.pki / "ca.crt"))
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            if r.status != 200:
                raise ClusterError("gpus", f"patching {name} status returned HTTP {r.status}")

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return run(["kubectl", f"--kubeconfig={self.cfg.kubeconfig}", "--request-timeout=10s", *args],
                   step="kubectl " + " ".join(args[:2]), check=check, timeout=30, input=input)
