"""A lease holder in its own process on Redis, for tests/faults/test_redis_faults.py: holds
one work ID with ``Lease.hold`` (background renewal) and checkpoints ``n`` = 1, 2, ... every
``--gap`` seconds, printing one JSON line per write (``{"ack": n, "token": t}``); the first
write refused prints ``{"lost": "<error class>"}``; then the same token is sent straight to
the backend once more (``{"direct": "<error class>"}``) and the process exits.

    python tests/faults/redis_holder_worker.py --url URL --prefix P --work-id W --ttl 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from worklease import Lease, LeaseLostError, RedisBackend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--work-id", required=True)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--gap", type=float, default=0.02)
    args = parser.parse_args()
    with RedisBackend.from_url(args.url, prefix=args.prefix) as backend:
        lease = Lease(backend, holder_id="stopped-holder", ttl=args.ttl)
        try:
            with lease.hold(args.work_id) as hold:
                n = 0
                while True:
                    n += 1
                    hold.checkpoint(b"zombie %d" % n)
                    print(json.dumps({"ack": n, "token": hold.token.fencing_token}), flush=True)
                    time.sleep(args.gap)
        except LeaseLostError as exc:
            print(json.dumps({"lost": type(exc).__name__}), flush=True)
            try:  # the same token straight to the server, past the lease's own checks
                backend.checkpoint(hold.token, b"zombie after", args.ttl)
                direct = "written"
            except LeaseLostError as refused:
                direct = type(refused).__name__
            print(json.dumps({"direct": direct}), flush=True)
            sys.exit(0)


if __name__ == "__main__":
    main()
