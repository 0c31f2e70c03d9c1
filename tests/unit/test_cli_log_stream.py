"""`disttrain logs` reads a pod's log through the kubernetes client itself (no fake of it): a
follow and a plain read both reach the API server with timeouts the client accepts, and a
stream that goes quiet ends the read (the caller resumes it) instead of hanging for good."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest
from disttrain_cli import cluster as cluster_mod
from disttrain_cli.cluster import Cluster

LOG = b"step 1/10 loss 2.30\nstep 2/10 loss 2.10\n"


class _Handler(BaseHTTPRequestHandler):
    """The API server's answer to a log read: chunked, one chunk as the trainer prints."""

    protocol_version = "HTTP/1.1"
    quiet_s = 0.0
    last = b""  # a last chunk: what the kubelet appends when it loses the container, or a line without newline

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        assert self.path.startswith("/api/v1/namespaces/ml/pods/digits-worker-0/log?"), self.path
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(LOG), LOG))
        self.wfile.flush()
        if "follow=true" in self.path:
            time.sleep(self.quiet_s)  # a trainer that prints nothing for a while
        if self.last:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(self.last), self.last))
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _cluster(host: str) -> Cluster:
    cfg = kubernetes.client.Configuration()
    cfg.host = host
    return Cluster(api=kubernetes.client.ApiClient(cfg), namespace="ml", where=host)


@pytest.mark.parametrize("follow", [False, True])
def test_a_log_is_read_through_the_client(api_server: str, follow: bool) -> None:
    out = io.BytesIO()
    _cluster(api_server).copy_log("digits-worker-0", "trainer", out, follow=follow, tail=2)
    assert out.getvalue() == LOG


def test_a_quiet_follow_ends_at_its_read_timeout(api_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Quiet for far longer than the read timeout: ending in less than half of it can only be the
    # timeout's doing, however slow a loaded host is (5 s quiet against a 4 s bound failed once).
    monkeypatch.setattr(_Handler, "quiet_s", 30.0)
    monkeypatch.setattr(cluster_mod, "FOLLOW_READ_TIMEOUT_S", 0.5)
    out = io.BytesIO()
    t0 = time.monotonic()
    _cluster(api_server).copy_log("digits-worker-0", "trainer", out, follow=True)
    assert out.getvalue() == LOG and time.monotonic() - t0 < 15


def test_the_kubelets_words_about_a_lost_container_are_a_note_not_a_pod_line(
    api_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = b'rpc error: code = NotFound desc = an error occurred when try to find container "fc26": not found'
    monkeypatch.setattr(_Handler, "last", lost)
    out = io.BytesIO()
    _cluster(api_server).copy_log("digits-worker-0", "trainer", out, follow=True)
    assert out.getvalue() == LOG
    assert capsys.readouterr().err == f"--- digits-worker-0: {lost.decode()} ---\n"


def test_a_last_line_without_newline_is_ended(api_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Handler, "last", b"step 3/10 loss 2.00")
    out = io.BytesIO()
    _cluster(api_server).copy_log("digits-worker-0", "trainer", out, follow=False)
    assert out.getvalue() == LOG + b"step 3/10 loss 2.00\n"
