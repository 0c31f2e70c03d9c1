"""Host bridge, one network namespace per node, routes between pod subnets; and their cleanup."""

from __future__ import annotations

from pathlib import Path

from .config import (
    BRIDGE,
    BRIDGE_CIDR,
    BRIDGE_IP,
    FORWARD_CHAIN,
    POD_CIDR,
    ClusterConfig,
    NodeConfig,
)
from .proc import run


def _ok(cmd: list[str]) -> bool:
    return run(cmd, step="network", check=False).returncode == 0


def setup_host(cfg: ClusterConfig) -> None:
    log = cfg.logs / "network.log"
    if not _ok(["ip", "link", "show", BRIDGE]):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"], step="network: bridge", log=log)
    run(["ip", "addr", "replace", f"{BRIDGE_IP}/24", "dev", BRIDGE], step="network: bridge", log=log)
    run(["ip", "link", "set", BRIDGE, "up"], step="network: bridge", log=log)
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    # Our own FORWARD chain, so a host firewall with policy DROP still passes node traffic
    # and cleanup deletes exactly what we added.
    if not _ok(["iptables", "-w", "-n", "-L", FORWARD_CHAIN]):
        run(["iptables", "-w", "-N", FORWARD_CHAIN], step="network: iptables", log=log)
    run(["iptables", "-w", "-F", FORWARD_CHAIN], step="network: iptables", log=log)
    for args in (["-s", BRIDGE_CIDR], ["-d", BRIDGE_CIDR], ["-s", POD_CIDR], ["-d", POD_CIDR]):
        run(["iptables", "-w", "-A", FORWARD_CHAIN, *args, "-j", "ACCEPT"], step="network: iptables", log=log)
    if not _ok(["iptables", "-w", "-C", "FORWARD", "-j", FORWARD_CHAIN]):
        run(["iptables", "-w", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN], step="network: iptables", log=log)


def setup_node(cfg: ClusterConfig, node: NodeConfig) -> None:
    step = f"network: {node.name}"
    log = cfg.logs / "network.log"
    ns = node.name
    if not cfg.node_netns(node).exists():
        run(["ip", "netns", "add", ns], step=step, log=log)
    if not _ok(["ip", "link", "show", node.veth_host]):
        run(["ip", "link", "add", node.veth_host, "type", "veth", "peer", "name", "eth0", "netns", ns],
            step=step, log=log)
    run(["ip", "link", "set", node.veth_host, "master", BRIDGE, "up"], step=step, log=log)
    nsx = ["nsenter", f"--net={cfg.node_netns(node)}"]
    run([*nsx, "ip", "addr", "replace", f"{node.ip}/24", "dev", "eth0"], step=step, log=log)
    run([*nsx, "ip", "link", "set", "eth0", "up"], step=step, log=log)
    run([*nsx, "ip", "link", "set", "lo", "up"], step=step, log=log)
    run([*nsx, "ip", "route", "replace", "default", "via", BRIDGE_IP], step=step, log=log)
    # ip_forward is per network namespace: the node routes between its pods and the bridge.
    run([*nsx, "sysctl", "-qw", "net.ipv4.ip_forward=1"], step=step, log=log)
    run(["ip", "route", "replace", node.pod_cidr, "via", node.ip], step=step, log=log)


def cleanup(cfg: ClusterConfig) -> None:
    """Remove everything above, including leftovers of runs with other node counts."""
    for ns in list_netns():
        idx = ns.removeprefix("dt-node")
        run(["ip", "link", "del", f"dtv{idx}"], step="cleanup", check=False)
        run(["ip", "netns", "del", ns], step="cleanup", check=False)
    routes = run(["ip", "-o", "route", "show"], step="cleanup", check=False).stdout
    for line in routes.splitlines():
        dst = line.split()[0]
        if dst.startswith("10.244.") and " via 10.250.0." in line:
            run(["ip", "route", "del", dst], step="cleanup", check=False)
    run(["ip", "link", "del", BRIDGE], step="cleanup", check=False)
    while _ok(["iptables", "-w", "-D", "FORWARD", "-j", FORWARD_CHAIN]):
        pass
    run(["iptables", "-w", "-F", FORWARD_CHAIN], step="cleanup", check=False)
    run(["iptables", "-w", "-X", FORWARD_CHAIN], step="cleanup", check=False)


def list_netns() -> list[str]:
    d = Path("/var/run/netns")
    return sorted(p.name for p in d.iterdir() if p.name.startswith("dt-node")) if d.exists() else []
