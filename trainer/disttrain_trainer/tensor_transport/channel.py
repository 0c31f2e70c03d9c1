"""gRPC channel and server settings both ends of the transport must agree on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import grpc

from .limits import MAX_MESSAGE_BYTES, Limits

OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Long polls sit idle for a whole round: keepalives tell a dead peer from a slow round.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's own reconnect backoff grows to 120 s by default: a restarted server would sit unused
    # that long. The caller's retry loop (with its own backoff) decides how patient to be.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
SERVER_OPTIONS = [*OPTIONS, ("grpc.http2.min_ping_interval_without_data_ms", 10_000)]
# Clients: a call the server refused for its rate or its calls in flight (limits.py) is tried
# again after a short backoff by gRPC itself, up to 5 times (unary calls, and streams whose first
# 256 KiB were all that was sent); a refusal that must not be retried says so (gate.trailer).
# Callers' own retry loops cover the rest.
OPTIONS.append(("grpc.service_config", json.dumps({"methodConfig": [{
    "name": [{}],  # every method of every service on the channel
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]})))  # fmt: skip


def server_options(limits: Limits) -> list[tuple[str, int]]:
    """The shared server options with the service's own limits in place of the defaults."""
    ours = dict(limits.server_options())
    return [*((k, v) for k, v in SERVER_OPTIONS if k not in ours), *ours.items()]

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"


@dataclass(frozen=True, kw_only=True)
class Tls:
    """A Kubernetes TLS Secret mounted as files: ca.crt, tls.crt, tls.key."""

    dir: Path

    def server_credentials(self) -> grpc.ServerCredentials:
        key = (self.dir / KEY_FILE).read_bytes()
        cert = (self.dir / CERT_FILE).read_bytes()
        return grpc.ssl_server_credentials([(key, cert)])

    def channel_credentials(self) -> grpc.ChannelCredentials:
        # Clients verify the server against the CA only; they hold no key of their own.
        return grpc.ssl_channel_credentials(root_certificates=(self.dir / CA_FILE).read_bytes())


def aio_channel(target: str, tls: Tls | None, server_name: str | None = None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(target, options=OPTIONS)
    opts = list(OPTIONS)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(target, tls.channel_credentials(), options=opts)


def channel(target: str, tls: Tls | None, server_name: str | None = None) -> grpc.Channel:
    """A blocking channel (the parameter-server workers)."""
    if tls is None:
        return grpc.insecure_channel(target, options=OPTIONS)
    opts = list(OPTIONS)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, tls.channel_credentials(), options=opts)


def add_port(server: grpc.aio.Server | grpc.Server, address: str, tls: Tls | None) -> int:
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, tls.server_credentials())
    if port == 0:
        raise OSError(f"cannot listen on {address}: in use, or not an address of this host")
    return port
