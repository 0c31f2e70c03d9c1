"""One node: a network namespace plus a private mount namespace running containerd, kubelet
and kube-proxy. Every process of a node lives in the cgroup disttrain/<node> (kubelet puts its
pods under it as cgroupRoot), so stopping a node is: SIGKILL everything in that cgroup."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import yaml

from .config import BRIDGE_IP, CLUSTER_DOMAIN, PAUSE_IMAGE, POD_CIDR, ClusterConfig, NodeConfig
from .proc import ClusterError, alive, cgroup_pids, kill_cgroup, run, spawn, wait_for

MNT_ROOT = Path("/run/disttrain/mnt")
# Host paths every kubelet/containerd writes to; each node gets its own folder mounted over them
# (two kubelets sharing /var/log/pods delete each other's logs; CRI pod netns files stay private).
# /var/lib/kubelet, whatever --root-dir says: the 1.20 kubelet keeps its device-plugin socket
# there (two kubelets starting at once each clear the folder and listen on the same
# kubelet.sock, and one dies: "bind: address already in use") and its self-signed serving
# certificate (--cert-dir's default: one node served the other's).
PRIVATE_MOUNTS = {"log-pods": "/var/log/pods", "log-containers": "/var/log/containers", "netns": "/run/netns",
                  "var-lib-kubelet": "/var/lib/kubelet"}


def cgroup_of(node: NodeConfig) -> str:
    return node.name


def system_cgroup(node: NodeConfig) -> str:
    """The cgroup of the node's daemons (containerd and its shims, kubelet, kube-proxy)."""
    return f"{cgroup_of(node)}/system"


def write_configs(cfg: ClusterConfig, node: NodeConfig, bin_dir: Path) -> None:
    d = cfg.node_dir(node)
    for sub in ("cni", "ipam", "kubelet", "volume-plugins", *PRIVATE_MOUNTS):
        (d / sub).mkdir(parents=True, exist_ok=True)
    cfg.node_image_store(node).mkdir(parents=True, exist_ok=True)
    cfg.node_state(node).mkdir(parents=True, exist_ok=True)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    (d / "containerd.toml").write_text(f"""version = 2
root = "{cfg.node_image_store(node)}"
state = "{cfg.node_state(node)}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{cfg.node_socket(node)}"
[ttrpc]
  address = "{cfg.node_state(node)}/ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # The sandbox may not lower oom_score_adj here; without this runc fails with
  # "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{d}/cni"
""")
    (d / "cni" / "10-disttrain.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0",
        "name": f"disttrain-{node.name}",
        "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(d / "ipam"),
                     "ranges": [[{"subnet": node.pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]},
        }],
    }, indent=1))
    (d / "resolv.conf").write_text(f"nameserver {BRIDGE_IP}\n")
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "readOnlyPort": 0,
        # The apiserver reaches kubelets anonymously (logs, exec); fine for a local dev cluster.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/disttrain/{cgroup_of(node)}",
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "clusterDNS": [BRIDGE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(d / "resolv.conf"),
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        # Images are imported, not pulled: never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # Short heartbeats so a stopped node turns NotReady within seconds.
        "nodeLeaseDurationSeconds": 8,
        "nodeStatusUpdateFrequency": "4s",
        "volumePluginDir": str(d / "volume-plugins"),
        "podPidsLimit": -1,
        # Kubernetes' default: 2 nodes then hold the 200 pods of the operator benchmark's 50 x 4
        # at once (with 60, 80 of them waited as "Too many pods").
        "maxPods": 110,
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "enableControllerAttachDetach": True,
    }
    (d / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
    proxy = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "bindAddress": node.ip,
        "clientConnection": {"kubeconfig": str(cfg.pki / "kube-proxy.kubeconfig")},
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": node.name,
        "mode": "iptables",
        # Pods of one node share a bridge: without SNAT a reply from a Service backend on the
        # same bridge bypasses the DNAT and the client drops it.
        "iptables": {"masqueradeAll": True, "syncPeriod": "10s", "minSyncPeriod": "0s"},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "metricsBindAddress": f"{node.ip}:10249",
        "healthzBindAddress": f"{node.ip}:10256",
        "oomScoreAdj": 0,
    }
    (d / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))


def ensure_mountns(cfg: ClusterConfig, node: NodeConfig) -> None:
    """A persistent private mount namespace (bind-mounted on a file, as `ip netns` does)."""
    step = f"mountns: {node.name}"
    MNT_ROOT.mkdir(parents=True, exist_ok=True)
    if run(["mountpoint", "-q", MNT_ROOT], step=step, check=False).returncode != 0:
        run(["mount", "--bind", MNT_ROOT, MNT_ROOT], step=step)
        run(["mount", "--make-private", MNT_ROOT], step=step)
    f = cfg.node_mountns(node)
    if f.exists() and run(["mountpoint", "-q", f], step=step, check=False).returncode == 0:
        return
    f.touch()
    for target in PRIVATE_MOUNTS.values():
        Path(target).mkdir(parents=True, exist_ok=True)
    d = cfg.node_dir(node)
    script = " && ".join(f"mount --bind {d / sub} {target}" for sub, target in PRIVATE_MOUNTS.items())
    run(["unshare", f"--mount={f}", "--propagation", "private", "sh", "-c", script],
        step=step, log=cfg.logs / "network.log")


def release_mountns(cfg: ClusterConfig, name: str) -> None:
    f = MNT_ROOT / name
    run(["umount", "-l", f], step="cleanup", check=False)
    f.unlink(missing_ok=True)


def _enter(cfg: ClusterConfig, node: NodeConfig) -> list[str]:
    return ["nsenter", f"--net={cfg.node_netns(node)}", f"--mount={cfg.node_mountns(node)}", "--"]


def ctr(cfg: ClusterConfig, node: NodeConfig, *args: str) -> list[str]:
    return ["ctr", "--address", str(cfg.node_socket(node)), "-n", "k8s.io", *args]


def start_containerd(cfg: ClusterConfig, node: NodeConfig, *, fresh: bool = True) -> None:
    d = cfg.node_dir(node)
    log = cfg.logs / f"{node.name}-containerd.log"
    if fresh:
        # Runtime state of a killed node (dead tasks, shim sockets) must not be resurrected.
        shutil.rmtree(cfg.node_state(node) / "state", ignore_errors=True)
    cfg.node_socket(node).unlink(missing_ok=True)
    pid = spawn([*_enter(cfg, node), "containerd", "--config", d / "containerd.toml"],
                log=log, cgroup=system_cgroup(node))
    wait_for(f"containerd of {node.name}",
             lambda: run(ctr(cfg, node, "version"), step="containerd", check=False).returncode == 0,
             timeout=30, step=f"containerd: {node.name}", log=log, pid=pid)


def start_runtime(cfg: ClusterConfig, node: NodeConfig) -> None:
    """containerd without the containers an earlier run of this node recorded (their tasks died
    with the node; their pods are gone or will be recreated).

    They are removed through containerd's own API, and containerd is then restarted: its CRI
    plugin loads every container into memory when it starts, so a container removed behind its
    back stays listed, every RemoveContainer of it answers NotFound, and the kubelet never
    finishes deleting its pod (seen: a pod Terminating for 40 minutes after its node restarted)."""
    start_containerd(cfg, node)
    ids = run(ctr(cfg, node, "containers", "ls", "-q"), step="containerd", check=False).stdout.split()
    if ids:
        run(ctr(cfg, node, "containers", "rm", *ids), step="containerd", check=False)
        restart_containerd(cfg, node)


def start_kubelet_and_proxy(cfg: ClusterConfig, node: NodeConfig, bin_dir: Path) -> None:
    d = cfg.node_dir(node)
    cg = system_cgroup(node)
    sock = f"unix://{cfg.node_socket(node)}"
    spawn([*_enter(cfg, node), bin_dir / "kubelet",
           f"--config={d / 'kubelet.yaml'}",
           f"--kubeconfig={cfg.pki / f'kubelet-{node.name}.kubeconfig'}",
           f"--root-dir={d / 'kubelet'}",
           f"--node-ip={node.ip}",
           f"--hostname-override={node.name}",
           "--container-runtime=remote",
           f"--container-runtime-endpoint={sock}",
           f"--image-service-endpoint={sock}",
           "--runtime-request-timeout=10m",
           "--v=1"],
          log=cfg.logs / f"{node.name}-kubelet.log", cgroup=cg)
    spawn([*_enter(cfg, node), bin_dir / "kube-proxy", f"--config={d / 'kube-proxy.yaml'}", "--v=1"],
          log=cfg.logs / f"{node.name}-kube-proxy.log", cgroup=cg)


def kubelet_binary(node: NodeConfig) -> Path | None:
    """The binary the node's running kubelet was started from (None when none runs)."""
    for pid in cgroup_pids(system_cgroup(node)):
        try:
            exe = Path(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if exe.name == "kubelet":
            return exe
    return None


def restart_containerd(cfg: ClusterConfig, node: NodeConfig) -> None:
    """Restart only the containerd daemon (shims and containers keep running): its CRI image
    cache otherwise keeps serving the old image behind a re-imported name."""
    for pid in cgroup_pids(system_cgroup(node)):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if os.path.basename(exe) == "containerd":
            os.kill(pid, signal.SIGKILL)
            wait_for("containerd to exit", lambda p=pid: not alive(p),
                     timeout=10, step=f"containerd restart: {node.name}")
    start_containerd(cfg, node, fresh=False)


def stop(cfg: ClusterConfig, node: NodeConfig) -> None:
    """kill -9 kubelet, kube-proxy, containerd, shims and every container of the node."""
    kill_cgroup(cgroup_of(node))


def check_binaries(bin_dir: Path) -> None:
    for b in ("kubelet", "kube-proxy"):
        if not (bin_dir / b).exists():
            raise ClusterError("binaries", f"{bin_dir / b} missing; run `make cluster-prereqs`")
    if not shutil.which("containerd"):
        raise ClusterError("binaries", "containerd not installed; run `make cluster-prereqs`")
