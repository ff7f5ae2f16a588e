#!/usr/bin/env python3
"""Calls a CSI driver on a unix socket with Python grpcio (grpc C-core).

C-core sends the socket path as the HTTP/2 :authority, which h2 rejects
unless the driver rewrites it (src/authority.rs). No generated stubs are
needed: requests are empty messages and replies come back as raw bytes.

Every call is made three times on one channel, so later requests reuse
C-core's HPACK dynamic-table entries from earlier (rewritten) ones.

Usage: grpcio_probe.py SOCKET_PATH
Prints one line per call, `METHOD <hex of the reply>`; exits 1 on an RPC error.
"""
import sys

import grpc

CALLS = [
    "/csi.v1.Identity/GetPluginInfo",
    "/csi.v1.Controller/ControllerGetCapabilities",
]


def main():
    socket_path = sys.argv[1]
    with grpc.insecure_channel("unix:" + socket_path) as channel:
        for method in CALLS * 3:
            call = channel.unary_unary(
                method,
                request_serializer=lambda _: b"",
                response_deserializer=lambda b: b,
            )
            try:
                reply = call(None, timeout=10)
            except grpc.RpcError as e:
                print(f"{method} FAILED {e.code()} {e.details()}", file=sys.stderr)
                sys.exit(1)
            print(method, reply.hex())


if __name__ == "__main__":
    main()
