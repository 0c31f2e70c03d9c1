"""Suite-wide policy.

Under CI=true no tier may silently skip: a skip in the dist, cluster or e2e
tiers becomes a failure that says why. Only tests marked `gpu` may skip (CI
never has a GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The suite's helper modules (ports.py, hf_tiny.py) for every tier: pytest imports test modules
# with --import-mode=importlib, which puts no test folder on sys.path.
sys.path.insert(0, str(Path(__file__).parent))

STRICT_TIERS = ("dist", "cluster", "e2e")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not in_ci() or not report.skipped or item.get_closest_marker("gpu"):
        return
    if any(item.get_closest_marker(tier) for tier in STRICT_TIERS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping this tier: {reason}"


TIERS = ("unit", *STRICT_TIERS)
# The cluster and e2e tiers share one local cluster. Under pytest-xdist's `--dist loadgroup`
# (`make test`) they run in two lanes (two xdist groups, each on one worker, each with its own
# operator and namespaces) while the other workers take the CPU-bound unit and dist tiers: the
# cluster tests mostly wait on pods, so two of them at once nearly halve the tiers' wall time.
# A test marked `whole_cluster` (it stops or drains a node, or installs an operator that
# watches every namespace) runs alone: it holds the cluster lock exclusively, every other
# cluster test holds it shared (`cluster_turn`).
CLUSTER_TIERS = ("cluster", "e2e")
CLUSTER_LANES = ("cluster-lane-1", "cluster-lane-2")
# Test files of the second lane (the rest run in the first), balanced by their measured time.
SECOND_LANE = frozenset({
    "test_network.py", "test_node_loss.py", "test_pods.py", "test_scheduling.py", "test_operator.py",
    "test_ownership.py", "test_paramserver.py", "test_federated.py", "test_identity.py",
    "test_recovery.py", "test_disruptions.py", "test_zz_incluster.py", "test_user_image.py",
    "test_object_store.py", "test_model_parallel.py",
})
TESTS_ROOT = Path(__file__).resolve().parent
CLUSTER_TURN_LOCK = Path(tempfile.gettempdir()) / "disttrain-cluster-tests.lock"
CLUSTER_TURN_GATE = Path(tempfile.gettempdir()) / "disttrain-cluster-tests.gate"
CLUSTER_USERS_LOCK = Path(tempfile.gettempdir()) / "disttrain-cluster-users.lock"


def cluster_lane(item: pytest.Item) -> str:
    return CLUSTER_LANES[1] if item.path.name in SECOND_LANE else CLUSTER_LANES[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's loadgroup reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tier is the folder: tests/dist -> dist, tests/cluster -> cluster, tests/e2e -> e2e.
    for item in items:
        parts = item.path.parts
        for tier in STRICT_TIERS:
            if tier in parts[parts.index("tests") + 1 :][:1]:
                item.add_marker(getattr(pytest.mark, tier))
                if tier in CLUSTER_TIERS:
                    item.add_marker(pytest.mark.xdist_group(name=cluster_lane(item)))
    # A whole-suite run (`make test`) must run every tier: a tier that collects nothing (a
    # folder lost to a .gitignore pattern, a broken conftest) fails instead of passing quietly.
    whole_suite = any(Path(arg).resolve() == TESTS_ROOT for arg in config.args)
    if whole_suite and not config.option.keyword and not config.option.markexpr:
        found = {tier: 0 for tier in TIERS}
        for item in items:
            rel = item.path.resolve().relative_to(TESTS_ROOT).parts
            if rel and rel[0] in found:
                found[rel[0]] += 1
        empty = [tier for tier, n in found.items() if n == 0]
        if empty:
            raise pytest.UsageError(f"no tests collected in tier(s) {', '.join(empty)} (tests/<tier>/)")
        # A renamed or removed cluster test file would silently move its lane's load to the other.
        stale = SECOND_LANE - {item.path.name for item in items if item.get_closest_marker("xdist_group")}
        if stale:
            raise pytest.UsageError(f"SECOND_LANE names cluster test files that do not exist: {sorted(stale)}")


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under `--dist loadgroup` every cluster test must carry its lane in its node id, or the
    # workers would run any number of them at once against one cluster.
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers only
        return
    loose = [i.nodeid for i in session.items
             if i.get_closest_marker("xdist_group") and not i.nodeid.endswith("@" + cluster_lane(i))]  # fmt: skip
    if loose:
        raise pytest.UsageError(f"--dist loadgroup did not group {loose[0]} (pytest-xdist and pytest versions?)")


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, mode)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def cluster_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """A cluster test's turn on the shared cluster: shared with the other lane's test, or the
    whole cluster for a `whole_cluster` test (taken before the test's own fixtures, released
    after their teardown)."""
    if not any(request.node.get_closest_marker(tier) for tier in CLUSTER_TIERS):
        yield
        return
    with turn_lock(exclusive=request.node.get_closest_marker("whole_cluster") is not None):
        yield


@contextlib.contextmanager
def turn_lock(*, exclusive: bool, lock: Path = CLUSTER_TURN_LOCK, gate: Path = CLUSTER_TURN_GATE) -> Iterator[None]:
    """`lock` shared, or exclusive, in the order asked for. Turns are taken through `gate`, one
    at a time, so an exclusive request that waits holds back later shared ones: flock alone
    grants a shared lock while an exclusive request waits, and a lane whose tests follow each
    other kept a waiting whole_cluster test out for 348 s (of its 600 s timeout) in a CI run."""
    with lock.open("a") as turn:
        with _flock(gate, fcntl.LOCK_EX):
            fcntl.flock(turn, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)


# ---- local cluster fixtures (hack/localcluster) ----------------------------------------------
# `local_cluster`: the project's own multi-node cluster (hack/localcluster). Reuses one that is
# already up (bringing its images up to date), else starts one and stops it at session end.
# `kubeconfig`: $KUBECONFIG when set (any cluster, e.g. kind), else the local cluster's.
# Under CI=true a cluster that cannot come up FAILS the test, naming the step and its log.

_HACK = Path(__file__).resolve().parents[1] / "hack"


def _cluster_unavailable(why: str) -> None:
    if in_ci():
        pytest.fail(f"local cluster unavailable under CI=true: {why}", pytrace=False)
    pytest.skip(f"local cluster unavailable: {why}")


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[object]:
    if str(_HACK) not in sys.path:
        sys.path.insert(0, str(_HACK))
    from localcluster import ClusterError, LocalCluster

    if os.geteuid() != 0:
        _cluster_unavailable("needs root (network namespaces, cgroups, mounts); run the tests as root")
    cluster = None
    started = False
    try:
        cluster = LocalCluster.current()
        if not cluster.is_up():
            cluster = LocalCluster()  # node count and GPUs from the environment, not the last run
        started = cluster.ensure_up()
    except (ClusterError, ValueError) as e:
        if started and cluster is not None:
            cluster.down()
        logs = cluster.cfg.logs if cluster is not None else "~/.cache/disttrain/cluster/logs"
        _cluster_unavailable(f"{e}\n(bring it up by hand with `make cluster-up`; logs in {logs})")
    # Held shared while this session uses the cluster: the session that started it stops it
    # only once the other lane's session is done with it too.
    with CLUSTER_USERS_LOCK.open("a") as users:
        fcntl.flock(users, fcntl.LOCK_SH)
        yield cluster
        if started:
            fcntl.flock(users, fcntl.LOCK_EX)
            cluster.down()


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env)
    return Path(request.getfixturevalue("local_cluster").kubeconfig)


# ---- end of local cluster fixtures ---------------------------------------------------------


# ------------------------------------------------------------ a real S3-compatible server


@dataclasses.dataclass(frozen=True)
class S3Server:
    """moto in server mode on loopback, requests signed and checked (IAM auth on): wrong keys are refused."""

    url: str
    key_id: str
    secret: str

    def env(self, **overrides: str) -> dict[str, str]:
        """What a trainer process needs: the AWS credential chain's variables."""
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_DEFAULT_REGION": "us-east-1", **overrides}  # fmt: skip

    def client(self) -> object:
        import boto3  # noqa: PLC0415 - boto3, only for the object-store tests

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=self.key_id, aws_secret_access_key=self.secret)  # fmt: skip

    def bucket(self, name: str) -> str:
        """A fresh bucket (names are per test: the server is shared by the session)."""
        bucket = f"{name}-{uuid.uuid4().hex[:8]}"
        self.client().create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        return bucket


@contextlib.contextmanager
def moto_server(host: str) -> Iterator[S3Server]:
    """moto's server on `host` (loopback for host-side tests; the cluster's node bridge address for
    pods: tests/e2e), with one IAM user whose key every request must be signed with."""
    import boto3  # noqa: PLC0415 - boto3, only for the object-store tests

    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    # The first 3 requests (the IAM user, its policy, its key) go unchecked; every later one must be
    # signed with that key, as a real store would insist.
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {url}") from None
                time.sleep(0.05)
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")  # fmt: skip
        iam.create_user(UserName="disttrain")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="disttrain", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="disttrain")["AccessKey"]
        yield S3Server(url=url, key_id=key["AccessKeyId"], secret=key["SecretAccessKey"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def s3_servers() -> Iterator[Callable[[str], S3Server]]:
    """One moto server per listening address, started on first use, stopped at session end."""
    with contextlib.ExitStack() as stack:
        started: dict[str, S3Server] = {}

        def on(host: str) -> S3Server:
            if host not in started:
                started[host] = stack.enter_context(moto_server(host))
            return started[host]

        yield on


@pytest.fixture(scope="session")
def s3_server(s3_servers: Callable[[str], S3Server]) -> S3Server:
    return s3_servers("127.0.0.1")


# ------------------------------------------------------------ a real MLflow tracking server


@dataclasses.dataclass(frozen=True)
class MlflowServer:
    """PyPI's `mlflow server`: runs in SQLite, artifacts served from a temp dir (the dev extra)."""

    url: str
    artifacts: Path

    def client(self) -> object:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 - mlflow, only for the tracking tests

        return MlflowClient(tracking_uri=self.url)


@contextlib.contextmanager
def mlflow_server(host: str) -> Iterator[MlflowServer]:
    """`mlflow server` on `host` (loopback for host-side tests; the cluster's node bridge address for
    pods: tests/e2e). Its start-up creates the SQLite schema: tens of seconds on a busy 2-core host."""
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="mlflow-") as tmp:
        root = Path(tmp)
        # No background job runner (the server's own task queue): nothing here uses it.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        mlflow = Path(sys.executable).parent / "mlflow"
        log = (root / "server.log").open("w")
        proc = subprocess.Popen([str(mlflow), "server", "--host", host, "--port", str(port), "--workers", "1",
                                 "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                                 "--artifacts-destination", str(root / "artifacts"),
                                 # Pods call it by the bridge address: its host-header check must allow it.
                                 "--allowed-hosts", f"{host}:{port},{host},localhost:{port},127.0.0.1:{port}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        url = f"http://{host}:{port}"
        try:
            deadline = time.monotonic() + 240
            while True:
                try:
                    urllib.request.urlopen(f"{url}/health", timeout=2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"mlflow server did not start on {url}:\n"
                                           f"{(root / 'server.log').read_text()[-3000:]}") from None  # fmt: skip
                    time.sleep(0.2)
            yield MlflowServer(url=url, artifacts=root / "artifacts")
        finally:
            # Its own session: uvicorn's worker goes with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            log.close()


@pytest.fixture(scope="session")
def mlflow_servers() -> Iterator[Callable[[str], MlflowServer]]:
    """One MLflow server per listening address, started on first use, stopped at session end."""
    with contextlib.ExitStack() as stack:
        started: dict[str, MlflowServer] = {}

        def on(host: str) -> MlflowServer:
            if host not in started:
                started[host] = stack.enter_context(mlflow_server(host))
            return started[host]

        yield on


@pytest.fixture(scope="session")
def mlflow_tracking_server(mlflow_servers: Callable[[str], MlflowServer]) -> MlflowServer:
    return mlflow_servers("127.0.0.1")
