"""A connection to the cluster for the job commands (submit, status, logs, delete): kubectl's
kubeconfig conventions (cluster_args.py), the few API calls they make, and every failure turned
into one sentence that says what went wrong and what to do (`ClusterError`).

Reads return the API server's JSON (what `kubectl get -o json` prints), not the client's models,
so the pure modules that format a job or choose a pod work on plain dicts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import kubernetes
import urllib3
import yaml
from disttrain_api.exitcodes import CONFIG as EXIT_INVALID
from disttrain_api.exitcodes import FAILED as EXIT_FAILED
from disttrain_api.model import GROUP, KIND, PLURAL, VERSION
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

# (connect, read) seconds of one request.
TIMEOUT = (10, 60)
# Read timeout of a log stream that follows: a quiet trainer may print nothing for minutes. The
# client takes no unbounded read (kubernetes >= 35 validates the timeout as numbers); a stream
# that times out is resumed from where it stopped (logs_cmd.py), as one that broke off.
FOLLOW_READ_TIMEOUT_S = 300.0
# How the kubelet's error text starts when it loses a container it streams the log of.
KUBELET_LOST_CONTAINER = (b"rpc error: code = NotFound", b"unable to retrieve container logs for ")
# What a user of the job commands needs, for a 403's message.
USER_RBAC = ("disttrainjobs: get list create update delete; pods: get list; pods/log: get; events: list")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # a pod's own credentials


class ClusterError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_FAILED, status: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status  # the API server's HTTP status; None when it was not reached


class NotFound(ClusterError):
    pass


class Conflict(ClusterError):
    pass


@dataclass(frozen=True)
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    where: str  # "https://10.0.0.1:6443 (context ml)": for messages

    # ------------------------------------------------------------------------- jobs

    def _custom(self) -> Any:
        return kubernetes.client.CustomObjectsApi(self.api)

    def job(self, name: str) -> dict[str, Any]:
        """The job, or NotFound naming the jobs the namespace has."""
        found = self.find_job(name)
        if found is None:
            others = sorted(j["metadata"]["name"] for j in self.jobs())
            there = f"its jobs: {', '.join(others)}" if others else "it has none"
            raise NotFound(f"DistTrainJob {name} not found in namespace {self.namespace} ({there}; "
                           "-n NAMESPACE picks another)")  # fmt: skip
        return found

    def find_job(self, name: str) -> dict[str, Any] | None:
        """The job, or None when the namespace has none of that name."""
        try:
            return self.read(self._custom().get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name)
        except NotFound:
            return None

    def jobs(self) -> list[dict[str, Any]]:
        return list(self.read(self._custom().list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                              PLURAL)["items"])  # fmt: skip

    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.read(self._custom().create_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, body)

    def replace_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT: the job becomes `body` (its resourceVersion makes a concurrent change a Conflict)."""
        return self.read(self._custom().replace_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                         name, body)  # fmt: skip

    def delete_job(self, name: str, *, propagation: str) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        self.read(self._custom().delete_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name,
                  body=body)  # fmt: skip

    # ------------------------------------------------------------------------- pods, events, logs

    def _core(self) -> Any:
        return kubernetes.client.CoreV1Api(self.api)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return list(self.read(self._core().list_namespaced_pod, self.namespace, label_selector=selector)["items"])

    def events(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The Events about this job (by UID: not those of an earlier job of the same name, nor of
        its headless Service, which shares its name)."""
        meta = job["metadata"]
        selector = f"involvedObject.kind={KIND},involvedObject.name={meta['name']},involvedObject.uid={meta['uid']}"
        return list(self.read(self._core().list_namespaced_event, self.namespace, field_selector=selector)["items"])

    def log(self, pod: str, container: str, *, follow: bool, tail: int | None = None,
            since_seconds: int | None = None) -> Any:  # fmt: skip
        """The pod's log as an open urllib3 response (`.stream()`), unread."""
        kwargs: dict[str, Any] = {"container": container, "follow": follow}
        if tail is not None:
            kwargs["tail_lines"] = tail
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        timeout = (TIMEOUT[0], FOLLOW_READ_TIMEOUT_S) if follow else TIMEOUT
        return self.call(self._core().read_namespaced_pod_log, pod, self.namespace, _timeout=timeout, **kwargs)

    def copy_log(self, pod: str, container: str, out: BinaryIO, *, follow: bool, tail: int | None = None,
                 since_seconds: int | None = None) -> None:  # fmt: skip
        """Write the pod's log to `out` as it comes; with `follow`, until the container ends or the
        connection drops (the caller decides whether to go on)."""
        resp = self.log(pod, container, follow=follow, tail=tail, since_seconds=since_seconds)
        partial = b""  # what came after the last newline: written once its line ends, or the stream does
        try:
            for chunk in resp.stream(4096, decode_content=True):
                data = partial + chunk
                cut = data.rfind(b"\n") + 1
                out.write(data[:cut])
                out.flush()
                partial = data[cut:]
        except (urllib3.exceptions.HTTPError, OSError):
            pass  # the stream broke off (a node lost, an API server restarted): the caller looks again
        finally:
            resp.release_conn()
        if partial.startswith(KUBELET_LOST_CONTAINER):
            # The kubelet's own words, appended to the stream without a newline, when the container
            # was removed under it (its pod went): a note, not a line of the pod's.
            print(f"--- {pod}: {partial.decode(errors='replace').strip()} ---", file=sys.stderr, flush=True)
        elif partial:
            out.write(partial + b"\n")  # the pod's last line had no newline: the next pod's starts on its own
            out.flush()

    # ------------------------------------------------------------------------- the calls

    def read(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        resp = self.call(fn, *args, **kwargs)
        try:
            return json.loads(resp.data or b"null")
        finally:
            resp.release_conn()

    def call(self, fn: Any, *args: Any, _timeout: Any = TIMEOUT, **kwargs: Any) -> Any:
        try:
            return fn(*args, _preload_content=False, _request_timeout=_timeout, **kwargs)
        except ApiException as err:
            raise api_error(err.status, err.body, where=self.where, namespace=self.namespace) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise ClusterError(unreachable(err, self.where)) from None


def api_error(status: int | None, body: Any, *, where: str, namespace: str) -> ClusterError:
    """The API server's refusal as one sentence: its own message (which names the user, verb and
    resource of a 403) and what to do about it."""
    err = _api_error(status, body, where=where, namespace=namespace)
    err.status = status
    return err


def _api_error(status: int | None, body: Any, *, where: str, namespace: str) -> ClusterError:
    try:
        decoded = json.loads(body) if isinstance(body, (str, bytes)) and body else {}
    except ValueError:
        decoded = {}
    decoded = decoded if isinstance(decoded, dict) else {}
    message = decoded.get("message") or (body.decode(errors="replace") if isinstance(body, bytes) else str(body or ""))
    details = decoded.get("details") or {}
    if status == 401:
        return ClusterError(f"the API server at {where} did not accept the kubeconfig's credentials "
                            f"(401 Unauthorized): {message or 'no message'}")  # fmt: skip
    if status == 403:
        return ClusterError(f"forbidden (403): {message}; the kubeconfig's user needs RBAC in namespace "
                            f"{namespace} for it ({USER_RBAC})")
    if status == 404 and details.get("name"):
        return NotFound(message)
    if status == 404:
        return ClusterError(f"the API server at {where} serves no {KIND} ({GROUP}/{VERSION}): install the CRD "
                            "(disttrain crd | kubectl apply -f -) and the operator (kubectl apply -k manifests/)")
    if status == 409:
        return Conflict(message)
    if status == 422:
        return ClusterError(f"the API server refused the job (422 Invalid): {message}; if `disttrain validate` "
                            "accepts it, the cluster's CRD is older than this disttrain (disttrain crd | kubectl "
                            "apply -f -)", exit_code=EXIT_INVALID)  # fmt: skip
    return ClusterError(f"the API server at {where} answered {status}: {message}")


def unreachable(err: BaseException, where: str) -> str:
    """`cannot reach ...: Connection refused`, without urllib3's object reprs."""
    reason = getattr(err, "reason", None) or err
    text = re.sub(r"<[^>]*>:?\s*", "", str(reason)).strip(" :") or type(err).__name__
    return f"cannot reach the Kubernetes API server at {where}: {text}; is the cluster up, and is this the " \
           "right kubeconfig and context?"  # fmt: skip


# ----------------------------------------------------------------------------- connecting


def kubeconfig_files(flag: str | None, env: dict[str, str]) -> tuple[list[str], str]:
    """The kubeconfig files kubectl would read, and where that list came from (for messages)."""
    if flag:
        return [flag], f"--kubeconfig {flag}"
    if env.get("KUBECONFIG"):
        return [p for p in env["KUBECONFIG"].split(os.pathsep) if p], f"KUBECONFIG={env['KUBECONFIG']}"
    return [str(Path("~/.kube/config").expanduser())], "~/.kube/config"


def connect(*, kubeconfig: str | None, context: str | None, namespace: str | None,
            env: dict[str, str] | None = None) -> Cluster:  # fmt: skip
    env = dict(os.environ) if env is None else env
    files, source = kubeconfig_files(kubeconfig, env)
    if kubeconfig and not Path(kubeconfig).exists():
        raise ClusterError(f"kubeconfig {kubeconfig} does not exist")
    present = [f for f in files if Path(f).expanduser().exists()]
    if not present:
        if not kubeconfig and not context and env.get("KUBERNETES_SERVICE_HOST") and (SA_DIR / "token").exists():
            return _in_cluster(namespace)
        raise ClusterError(f"no kubeconfig: {source} does not exist; set KUBECONFIG or pass --kubeconfig")
    config_file = os.pathsep.join(present)
    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=config_file)
        # kubectl: the first file that sets current-context wins (the client's merge keeps the last).
        name = context or next((c for c in map(_current_context, present) if c), None)
        if name is None:
            raise ClusterError(f"{source} names no current context; pass --context")
        active = next((c for c in contexts if c.get("name") == name), None)
        if active is None:
            known = ", ".join(sorted(c.get("name", "?") for c in contexts)) or "none"
            raise ClusterError(f"context {name} is not in {source} (its contexts: {known})")
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=config_file, context=name,
                                           client_configuration=configuration, persist_config=False)  # fmt: skip
    except (ConfigException, yaml.YAMLError, OSError) as err:
        raise ClusterError(f"kubeconfig ({source}): {err}") from None
    ns = namespace or (active.get("context") or {}).get("namespace") or "default"
    where = f"{configuration.host} (context {active.get('name')})"
    return Cluster(api=kubernetes.client.ApiClient(configuration), namespace=ns, where=where)


def _current_context(path: str) -> str | None:
    loaded = yaml.safe_load(Path(path).expanduser().read_text())
    return str(loaded.get("current-context") or "") or None if isinstance(loaded, dict) else None


def _in_cluster(namespace: str | None) -> Cluster:
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except ConfigException as err:
        raise ClusterError(f"in-cluster configuration: {err}") from None
    ns = namespace or (SA_DIR / "namespace").read_text().strip() or "default"
    return Cluster(api=kubernetes.client.ApiClient(configuration), namespace=ns,
                   where=f"{configuration.host} (in-cluster service account)")  # fmt: skip
