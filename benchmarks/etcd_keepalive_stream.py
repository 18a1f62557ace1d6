"""Why etcd's keepalive answers come back short (ADR-0016): the evidence, re-runnable.

On a private 3-member cluster (tests/etcd.py), sends keepalive requests of many lease lines
straight to the JSON gateway (no worklease code involved) and counts the answer lines:

- per request size, on the leader and on a follower: how many requests came back short, the
  fewest lines answered, and whether the answered lines were always the first ones;
- whether the unanswered leases were refreshed (their TTLs read back);
- two controls for the cause (Go's net/http discarding the unread rest of a request once
  the handler answers): a body padded past 256 KiB, and one sent with Expect: 100-continue.

    python benchmarks/etcd_keepalive_stream.py [--tries 30]

Prints a Markdown report; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import etcd  # noqa: E402
from worklease._etcd import keepalive_bodies  # noqa: E402

SIZES = (8, 16, 17, 18, 19, 20, 32, 64, 128, 256, 1000)


def send(client: httpx.Client, url: str, lines: list[str], **headers: str) -> list[int]:
    """The lease IDs one keepalive request was answered for, in answer order."""
    answer = client.post(
        url + "/v3/lease/keepalive",
        content="\n".join(lines),
        headers={"Content-Type": "application/json", **headers},
    )
    found = []
    for line in answer.text.splitlines():
        if line.strip() and "result" in line:
            found.append(int(json.loads(line)["result"]["ID"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=30, help="requests per size and member")
    args = parser.parse_args()
    cluster = etcd.start_cluster(3)
    try:
        leader = cluster.leader()
        follower = next(m for m in cluster.members if m is not leader)
        with httpx.Client(timeout=30.0) as client:
            grant = leader.client_url + "/v3/lease/grant"
            leases = [int(client.post(grant, json={"TTL": 60}).json()["ID"]) for _ in range(1000)]
            print(f"# etcd keepalive answers ({etcd.find_etcd()}, 3 members, loopback)\n")
            print("| member | lines | bytes | short | fewest answered | always a prefix |")
            print("| --- | ---: | ---: | ---: | ---: | --- |")
            for name, member in (("leader", leader), ("follower", follower)):
                for size in SIZES:
                    lines = [f'{{"ID":{lease}}}' for lease in leases[:size]]
                    short, fewest, prefix = 0, size, True
                    for _ in range(args.tries):
                        got = send(client, member.client_url, lines)
                        short += len(got) < size
                        fewest = min(fewest, len(got))
                        prefix = prefix and got == leases[: len(got)]
                    nbytes = len("\n".join(lines).encode())
                    cells = (name, size, nbytes, f"{short}/{args.tries}", fewest, prefix)
                    print("| " + " | ".join(str(cell) for cell in cells) + " |")
            # The leases a short answer left out: were they refreshed?
            time.sleep(3.0)
            lines = [f'{{"ID":{lease}}}' for lease in leases]
            for _ in range(args.tries):
                got = send(client, leader.client_url, lines)
                if len(got) < len(leases):
                    break
            ttl = "/v3/lease/timetolive"

            def left(lease: int) -> int:
                return int(
                    client.post(leader.client_url + ttl, json={"ID": str(lease)}).json()["TTL"]
                )

            if len(got) < len(leases):
                print(
                    f"\nA short answer ({len(got)} of {len(leases)}) 3 s after the grants: "
                    f"TTL left of an answered lease {left(got[0])} s, of unanswered ones "
                    f"{left(leases[len(got)])} s and {left(leases[-1])} s (of 60)."
                )
            for label, pad, headers in (
                ("padded past 256 KiB", " " * (300 * 1024), {}),
                ("with Expect: 100-continue", "", {"Expect": "100-continue"}),
            ):
                short = 0
                for _ in range(args.tries):
                    answer = client.post(
                        leader.client_url + "/v3/lease/keepalive",
                        content="\n".join(lines) + pad,
                        headers={"Content-Type": "application/json", **headers},
                    )
                    short += sum(1 for line in answer.text.splitlines() if "result" in line) < 1000
                print(f"\n1,000 lines {label}: {short}/{args.tries} short.")
            bodies = keepalive_bodies(leases)
            short = 0
            started = time.perf_counter()
            for body in bodies:
                part = body.split("\n")
                short += len(send(client, follower.client_url, part)) < len(part)
            took = time.perf_counter() - started
            print(
                f"\nThe backend's requests for 1,000 leases: {len(bodies)} of at most "
                f"{max(len(b.encode()) for b in bodies)} bytes, {short} short, "
                f"{took:.2f} s one after another on a follower."
            )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
