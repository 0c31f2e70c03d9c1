"""The operator's progress scrape of a worker pod is bounded: a total deadline, a byte cap, no
redirects. Real HTTP servers on 127.0.0.1 play a hostile pod: one that trickles its answer a
byte at a time, one that sends an endless body, one that redirects elsewhere."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from disttrain_api import metric_names as names
from disttrain_operator import progress
from ports import free_port  # tests/ports.py: each xdist worker's own slice
from prometheus_client import CollectorRegistry, Gauge, start_http_server

HANG_S = 30.0  # a scrape still running after this is stuck: the bound is 1 s


class Hostile(BaseHTTPRequestHandler):
    behaviour: Callable[[BaseHTTPRequestHandler], None]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            type(self).behaviour(self)
        except OSError:
            pass  # the scraper hung up: what it should do

    def log_message(self, *args: object) -> None:
        pass


def trickle_headers(h: BaseHTTPRequestHandler) -> None:
    h.wfile.write(b"HTTP/1.0 200 OK\r\n")
    while True:  # a header line that never ends, one byte at a time, each well within any per-read timeout
        h.wfile.write(b"x")
        h.wfile.flush()
        time.sleep(0.05)


def trickle_body(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.end_headers()
    h.wfile.write(b"disttrain_step 5\n")
    while True:
        h.wfile.write(b"#")
        h.wfile.flush()
        time.sleep(0.05)


def endless_body(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.end_headers()
    line = b"# padding " + b"x" * 1000 + b"\n"
    while True:
        h.wfile.write(line * 64)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[BaseHTTPRequestHandler], None]], int]]:
    servers: list[ThreadingHTTPServer] = []

    def start(behaviour: Callable[[BaseHTTPRequestHandler], None]) -> int:
        handler = type("Handler", (Hostile,), {"behaviour": staticmethod(behaviour)})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def bounded(call: Callable[[], object]) -> object:
    """Run `call` in a thread; fail if it has not returned after HANG_S."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), f"the scrape was still running after {HANG_S} s"
    return out[0]


def metrics_endpoint(step: float) -> tuple[int, Callable[[], None]]:
    """A trainer's real endpoint (prometheus_client), as rank 0 serves it."""
    registry = CollectorRegistry()
    Gauge(names.STEP, "step", registry=registry).set(step)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    return port, server.shutdown


def test_a_trainers_endpoint_is_read() -> None:
    port, stop = metrics_endpoint(42)
    try:
        assert progress.scrape("127.0.0.1", port, timeout_s=5.0) == {names.STEP: 42.0}
    finally:
        stop()


@pytest.mark.parametrize("behaviour", [trickle_headers, trickle_body], ids=["headers", "body"])
def test_an_answer_trickling_in_forever_is_given_up_at_the_total_deadline(serve, behaviour) -> None:  # noqa: ANN001
    port = serve(behaviour)
    assert bounded(lambda: progress.scrape("127.0.0.1", port, timeout_s=1.0)) is None


def test_an_endless_body_is_cut_off_at_the_byte_cap(serve) -> None:  # noqa: ANN001
    port = serve(endless_body)
    # A generous deadline: the byte cap, not the clock, ends these reads.
    assert bounded(lambda: progress.read_bounded("127.0.0.1", port, timeout_s=HANG_S - 5, max_bytes=1 << 20)) is None
    assert bounded(lambda: progress.scrape("127.0.0.1", port, timeout_s=HANG_S - 5)) is None


def test_a_redirect_is_not_followed(serve) -> None:  # noqa: ANN001
    port, stop = metrics_endpoint(7)  # what the redirect points at: a valid reading elsewhere
    try:
        def redirect(h: BaseHTTPRequestHandler) -> None:
            h.send_response(302)
            h.send_header("Location", f"http://127.0.0.1:{port}/metrics")
            h.end_headers()

        hostile = serve(redirect)
        assert bounded(lambda: progress.scrape("127.0.0.1", hostile, timeout_s=5.0)) is None
    finally:
        stop()


def test_a_body_shorter_than_its_content_length_is_no_reading(serve) -> None:  # noqa: ANN001
    def short(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        h.wfile.write(b"disttrain_step 3\n")

    port = serve(short)
    assert progress.scrape("127.0.0.1", port, timeout_s=5.0) is None
