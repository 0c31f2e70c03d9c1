"""The chunked-tensor gRPC transport shared by the federated and parameter-server modes.

Tensors cross the wire as their raw bytes cut into chunks (`codec`), so no
message limit applies and nothing is encoded per float; `channel` holds the
gRPC options and credentials both sides must agree on; `auth` the per-client
tokens checked on every call.
"""

from __future__ import annotations
