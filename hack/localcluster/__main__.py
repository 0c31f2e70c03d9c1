"""python -m localcluster (PYTHONPATH=hack): up | down | status | images | image-cuda | stop-node | start-node | gpus."""

from __future__ import annotations

import argparse
import sys

from .cluster import LocalCluster, bin_dir
from .config import ClusterConfig
from .proc import ClusterError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="localcluster")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="(re)start the cluster; prints the kubeconfig path")
    up.add_argument("--nodes", type=int, default=None, help="node count (default $DISTTRAIN_NODES or 2)")
    up.add_argument("--gpus", default=None, help="nvidia.com/gpu per node: '2=2,1=0' (default: last node 2)")
    sub.add_parser("down", help="stop everything and remove its state (caches stay)")
    sub.add_parser("status", help="exit 0 when the cluster is up")
    sub.add_parser("images", help="build changed images (pause, test, trainer, operator, my-model)")
    cuda = sub.add_parser("image-cuda", help="build and check the CUDA trainer image (several GB; not used by the cluster)")
    cuda.add_argument("--torch-index", default=None, help="index with a CUDA build of torch (default: PyPI)")
    sub.add_parser("kubeconfig", help="print the kubeconfig path")
    for name in ("stop-node", "start-node"):
        sub.add_parser(name).add_argument("node")
    g = sub.add_parser("gpus", help="advertise N nvidia.com/gpu on a node")
    g.add_argument("node")
    g.add_argument("count", type=int)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "up":
            c = LocalCluster(ClusterConfig.from_env(nodes=a.nodes, gpus=a.gpus))
            c.up()
            print(c.kubeconfig)
        elif a.cmd == "down":
            LocalCluster.current().down()
        elif a.cmd == "status":
            c = LocalCluster.current()
            ok = c.is_up()
            print(f"{'up' if ok else 'down'}: {c.kubeconfig}")
            return 0 if ok else 1
        elif a.cmd == "images":
            from . import images

            for ar in images.ensure_all(bin_dir()).values():
                print(f"{ar.ref}  {ar.path}")
        elif a.cmd == "image-cuda":
            from . import cuda_image

            return cuda_image.main(a.torch_index or cuda_image.DEFAULT_TORCH_INDEX)
        elif a.cmd == "kubeconfig":
            print(LocalCluster.current().kubeconfig)
        elif a.cmd == "stop-node":
            LocalCluster.current().stop_node(a.node)
        elif a.cmd == "start-node":
            LocalCluster.current().start_node(a.node)
        elif a.cmd == "gpus":
            LocalCluster.current().set_node_gpus(a.node, a.count)
    except ClusterError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
