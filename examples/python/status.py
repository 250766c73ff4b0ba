#!/usr/bin/env python3
"""Prints a Sluice node's view of its cluster (gRPC sluice.v1.Admin/Status).

    ./generate.sh                       # once: the stubs, into ./gen
    ./status.py --addr 127.0.0.1:8081

prints the StatusResponse as protobuf JSON, as `sluice status --json` does:
proto field names, every field present, 64-bit numbers as strings. Exits 0,
or 2 on an error (an unreachable node, or a node that requires a client
certificate for Admin calls).
"""

import argparse
import os
import sys


def fail(msg):
    print(f"status.py: {msg}", file=sys.stderr)
    return 2


def to_json(msg):
    from google.protobuf import json_format
    try:  # protobuf 5.26 and later
        return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=None,
                                         always_print_fields_with_no_presence=True)
    except TypeError:  # earlier releases, such as Debian 12's 4.21
        return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=None,
                                         including_default_value_fields=True)


def main(argv):
    p = argparse.ArgumentParser(description="Print a Sluice node's status (gRPC sluice.v1.Admin/Status).")
    p.add_argument("--addr", default="127.0.0.1:8081", help="gRPC address of the node (default %(default)s)")
    p.add_argument("--timeout", type=float, default=5.0, help="deadline of the call in seconds (default %(default)s)")
    p.add_argument("--stubs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"),
                   help="directory generate.sh wrote the stubs into (default: gen next to this file)")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.stubs, "sluice", "v1", "sluice_pb2.py")):
        return fail(f"no stubs in {args.stubs}: run generate.sh {args.stubs}")
    sys.path.insert(0, args.stubs)
    import grpc
    from sluice.v1 import sluice_pb2 as pb
    from sluice.v1 import sluice_pb2_grpc as pb_grpc

    with grpc.insecure_channel(args.addr) as channel:
        try:
            st = pb_grpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=args.timeout)
        except grpc.RpcError as e:
            return fail(f"{args.addr}: {e.code().name}: {e.details()}")
    print(to_json(st))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
