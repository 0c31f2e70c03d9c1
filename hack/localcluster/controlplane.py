"""The control plane on the host: etcd, kube-apiserver, controller-manager, scheduler, and the
cluster DNS (dnsmasq fed by our watcher). All of it lives in cgroup disttrain/control."""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import sys
import urllib.request
from pathlib import Path

from . import volumewatch
from .config import (
    APISERVER_PORT,
    BRIDGE_IP,
    CLUSTER_DOMAIN,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    POD_CIDR,
    SERVICE_CIDR,
    ClusterConfig,
)
from .proc import ClusterError, alive, cgroup_pids, spawn, wait_for

CGROUP = "control"
HOSTPATH_PROVISIONER = "--enable-hostpath-provisioner=true"
ETCD_DATA = Path("/dev/shm/disttrain-etcd")


def start_etcd(cfg: ClusterConfig) -> None:
    # On tmpfs: fsync per write is what makes etcd slow on a small box; the cluster is disposable.
    data = ETCD_DATA
    shutil.rmtree(data, ignore_errors=True)  # every bring-up is a fresh cluster
    log = cfg.logs / "etcd.log"
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    pid = spawn([etcd, "--name=disttrain", f"--data-dir={data}",
                 f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                 f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                 f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                 f"--initial-cluster=disttrain=http://127.0.0.1:{ETCD_PEER_PORT}",
                 "--log-level=warn"],
                log=log, cgroup=CGROUP)
    wait_for("etcd health", lambda: _http_ok(f"http://127.0.0.1:{ETCD_CLIENT_PORT}/health"),
             timeout=30, step="etcd", log=log, pid=pid)


def start_apiserver(cfg: ClusterConfig, bin_dir: Path) -> None:
    p = cfg.pki
    log = cfg.logs / "kube-apiserver.log"
    pid = spawn([bin_dir / "kube-apiserver",
                 f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                 f"--bind-address={BRIDGE_IP}", f"--advertise-address={BRIDGE_IP}",
                 f"--secure-port={APISERVER_PORT}", "--insecure-port=0",
                 f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
                 f"--client-ca-file={p / 'ca.crt'}",
                 f"--token-auth-file={p / 'tokens.csv'}",
                 "--authorization-mode=Node,RBAC",
                 f"--service-account-key-file={p / 'sa.pub'}",
                 f"--service-account-signing-key-file={p / 'sa.key'}",
                 f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
                 f"--service-cluster-ip-range={SERVICE_CIDR}",
                 # We write the `kubernetes` Endpoints ourselves (the bridge address).
                 "--endpoint-reconciler-type=none",
                 "--kubelet-preferred-address-types=InternalIP",
                 "--allow-privileged=true",
                 # Pods tolerate an unreachable/not-ready node for 5 s instead of 300 s, so
                 # node-loss tests see evictions within seconds.
                 "--default-not-ready-toleration-seconds=5",
                 "--default-unreachable-toleration-seconds=5",
                 # OwnerReferencesPermissionEnforcement: setting blockOwnerDeletion on a child
                 # needs update on the owner's finalizers, as on managed clusters; without it
                 # here, a missing RBAC rule would only show up there.
                 "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
                 "--v=1"],
                log=log, cgroup=CGROUP)
    ctx = ssl.create_default_context(cafile=str(p / "ca.crt"))
    wait_for("apiserver /readyz",
             lambda: _http_ok(f"https://{BRIDGE_IP}:{APISERVER_PORT}/readyz", ctx=ctx, token=_admin_token(cfg)),
             timeout=90, step="kube-apiserver", log=log, pid=pid)


def start_controllers(cfg: ClusterConfig, bin_dir: Path) -> None:
    start_controller_manager(cfg, bin_dir)
    spawn([bin_dir / "kube-scheduler",
           f"--kubeconfig={cfg.pki / 'scheduler.kubeconfig'}",
           "--leader-elect=false", "--bind-address=127.0.0.1", "--port=0", "--v=1"],
          log=cfg.logs / "kube-scheduler.log", cgroup=CGROUP)


def start_controller_manager(cfg: ClusterConfig, bin_dir: Path) -> None:
    p = cfg.pki
    spawn([bin_dir / "kube-controller-manager",
           f"--kubeconfig={p / 'controller-manager.kubeconfig'}",
           "--leader-elect=false", "--use-service-account-credentials=true",
           f"--service-account-private-key-file={p / 'sa.key'}",
           f"--root-ca-file={p / 'ca.crt'}",
           f"--cluster-cidr={POD_CIDR}", "--allocate-node-cidrs=false",
           f"--service-cluster-ip-range={SERVICE_CIDR}",
           "--controllers=*,-nodeipam,-cloud-node-lifecycle,-route,-service,-bootstrapsigner,-tokencleaner",
           # Node loss in seconds: NotReady 20 s after the last heartbeat, then the 5 s
           # toleration set on the apiserver evicts its pods. (10 s was too short for a busy
           # 2-core CI host: lease renewals answered seconds late made a node NotReady for a
           # moment, and its training pods were evicted.)
           "--node-monitor-period=2s", "--node-monitor-grace-period=20s",
           "--pod-eviction-timeout=5s", "--terminated-pod-gc-threshold=200",
           # A claim created with its pre-bound volume (one apply) usually reaches the volume
           # controller before the volume's own informer event and waits for the next resync:
           # 15 s by default, which every test namespace paid before its first pod.
           "--pvclaimbinder-sync-period=1s",
           # Dynamic PersistentVolumes: folders under /tmp/hostpath_pv, one file system for every
           # node of this machine (volumewatch.py makes them writable for non-root pods).
           HOSTPATH_PROVISIONER,
           "--port=0", "--secure-port=0", "--v=1"],
          log=cfg.logs / "kube-controller-manager.log", cgroup=CGROUP)


def start_volume_watch(cfg: ClusterConfig) -> None:
    """The watcher that opens every hostPath-provisioned volume to non-root pods (volumewatch.py);
    before the controller-manager, so the first volume is seen."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    spawn([sys.executable, "-m", "localcluster.volumewatch", "--dir", volumewatch.VOLUMES_DIR],
          log=cfg.logs / "volumewatch.log", cgroup=CGROUP, env=env)


def _commands() -> dict[int, list[str]]:
    """The command line of every process of the control plane, by pid."""
    out: dict[int, list[str]] = {}
    for pid in cgroup_pids(CGROUP):
        try:
            out[pid] = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue  # exited meanwhile
    return out


def controller_manager_flags() -> list[str]:
    """The flags of the running kube-controller-manager ([] when none runs)."""
    for args in _commands().values():
        if args and os.path.basename(args[0]) == "kube-controller-manager":
            return args[1:]
    return []


def running(module: str) -> bool:
    """Whether a `python -m localcluster.<module>` process of the control plane runs."""
    return any(f"localcluster.{module}" in args for args in _commands().values())


def stop_controller_manager() -> None:
    for pid, args in _commands().items():
        if args and os.path.basename(args[0]) == "kube-controller-manager":
            os.kill(pid, signal.SIGKILL)
            wait_for("kube-controller-manager to exit", lambda p=pid: not alive(p), timeout=10,
                     step="controller-manager restart")


def start_dns(cfg: ClusterConfig) -> None:
    d = cfg.root / "dns"
    d.mkdir(parents=True, exist_ok=True)
    hosts = d / "hosts"
    hosts.write_text("")
    log = cfg.logs / "dnsmasq.log"
    dnsmasq = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    spawn([dnsmasq, "--keep-in-foreground", "--no-resolv", "--no-hosts", "--user=root",
           f"--listen-address={BRIDGE_IP}", "--bind-interfaces", f"--addn-hosts={hosts}",
           f"--local=/{CLUSTER_DOMAIN}/", "--no-negcache", f"--pid-file={d / 'dnsmasq.pid'}",
           "--log-facility=-"],
          log=log, cgroup=CGROUP)
    wait_for("dnsmasq pid file", lambda: (d / "dnsmasq.pid").exists() and (d / "dnsmasq.pid").read_text().strip() != "",
             timeout=10, step="dnsmasq", log=log)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    spawn([sys.executable, "-m", "localcluster.dnswatch", "--kubeconfig", cfg.kubeconfig,
           "--hosts", hosts, "--pid-file", d / "dnsmasq.pid"],
          log=cfg.logs / "dnswatch.log", cgroup=CGROUP, env=env)


def _admin_token(cfg: ClusterConfig) -> str:
    for line in (cfg.pki / "tokens.csv").read_text().splitlines():
        if ",disttrain-admin," in line:
            return line.split(",")[0]
    raise ClusterError("pki", "admin token missing from tokens.csv")


def _http_ok(url: str, *, ctx: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except Exception:  # noqa: BLE001 - any failure just means "not yet"
        return False
