"""Client for bench/list-memory (standard library only).

  python3 bench/list_memory.py seed URL TEAM COUNT PARALLEL
      PUTs COUNT workloads w-000.. to TEAM, each as large as the spec limits allow,
      PARALLEL at a time; prints one line of counts. Exits 1 if any PUT failed.
  python3 bench/list_memory.py load URL PATH CLIENTS SECONDS
      CLIENTS threads, each on its own keep-alive connection, GET PATH in a loop for
      SECONDS; prints key=value lines: counts per status, bytes per 200, items per
      page, whether `next` was present, latency.

The bearer token comes from BENCH_TOKEN. Only loopback URLs are accepted.
"""

import base64
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

SCRIPT_CHARS = 60_000  # run.script: at most 65,536
COMMAND_ARGS, COMMAND_ARG_CHARS = 15, 4_000  # run.command: 4,096 each, 65,536 in all
ENV_VARS, ENV_VALUE_CHARS = 4, 30_000  # run.env: 32,768 each, 131,072 in all


def target(url):
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"list_memory.py: refusing to send traffic to {u.hostname}")
    return u.hostname, u.port


def headers():
    return {"Authorization": "Bearer " + os.environ["BENCH_TOKEN"], "Content-Type": "application/json"}


def spec(i, pool):
    # Distinct, incompressible text per workload (base64 of random bytes, sliced at an
    # offset), so Postgres stores it at full size rather than TOAST-compressing a run of 'x'.
    def text(n, k):
        start = (i * 7919 + k * 104_729) % (len(pool) - n)
        return pool[start:start + n]

    return {
        "spec": {
            "kind": "batch",
            "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}},
            "run": {
                "script": "#!/bin/sh\n# " + text(SCRIPT_CHARS - 12, 0),
                "command": [text(COMMAND_ARG_CHARS, 1 + a) for a in range(COMMAND_ARGS)],
                "env": {f"BENCH_VAR_{e}": text(ENV_VALUE_CHARS, 100 + e) for e in range(ENV_VARS)},
            },
        }
    }


def seed(url, team, count, parallel):
    host, port = target(url)
    pool = base64.b64encode(os.urandom(900_000)).decode()
    local = threading.local()
    statuses = Counter()
    sizes = []
    errors = []
    lock = threading.Lock()

    def put(i):
        body = json.dumps(spec(i, pool)).encode()
        for attempt in range(3):
            conn = getattr(local, "conn", None) or http.client.HTTPConnection(host, port, timeout=60)
            local.conn = conn
            try:
                conn.request("PUT", f"/api/v1/teams/{team}/workloads/w-{i:03d}", body=body, headers=headers())
                resp = conn.getresponse()
                answer = resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    conn.close()
                    local.conn = None
                with lock:
                    statuses[resp.status] += 1
                    sizes.append(len(body))
                    if resp.status not in (200, 201) and len(errors) < 3:
                        errors.append(f"w-{i:03d}: {resp.status} {answer[:300]!r}")
                return
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                local.conn = None
                if attempt == 2:
                    with lock:
                        statuses["error"] += 1
                        errors.append(f"w-{i:03d}: {e!r}")

    started = time.monotonic()
    with ThreadPoolExecutor(parallel) as ex:
        list(ex.map(put, range(count)))
    took = time.monotonic() - started
    ok = statuses[200] + statuses[201]
    print(
        f"seeded {ok}/{count} workloads in {took:.1f}s "
        f"(request bodies {min(sizes)}..{max(sizes)} bytes, {sum(sizes) / 1e6:.1f} MB in all; "
        f"statuses {dict(sorted(statuses.items(), key=str))})"
    )
    for e in errors:
        print("  seed error:", e)
    return 0 if ok == count else 1


def load(url, path, clients, seconds):
    host, port = target(url)
    hdrs = headers()
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    statuses = Counter()
    ok_bytes = []
    latencies = []
    samples = {}  # status -> one body
    errors = Counter()

    def client():
        conn = None
        mine_status, mine_bytes, mine_lat = Counter(), [], []
        mine_samples, mine_errors = {}, Counter()
        while time.monotonic() < deadline:
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=60)
            t0 = time.monotonic()
            try:
                conn.request("GET", path, headers=hdrs)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as e:
                mine_errors[type(e).__name__] += 1
                conn.close()
                conn = None
                continue
            mine_lat.append(time.monotonic() - t0)
            mine_status[resp.status] += 1
            if resp.status == 200:
                mine_bytes.append(len(body))
            if resp.status not in mine_samples:
                mine_samples[resp.status] = (body, dict(resp.getheaders()))
            if resp.getheader("connection", "").lower() == "close" or resp.will_close:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()
        with lock:
            statuses.update(mine_status)
            ok_bytes.extend(mine_bytes)
            latencies.extend(mine_lat)
            errors.update(mine_errors)
            for k, v in mine_samples.items():
                samples.setdefault(k, v)

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started

    total = sum(statuses.values())
    other = {k: v for k, v in statuses.items() if k not in (200, 429)}
    print(f"requests={total}")
    print(f"duration_s={took:.1f}")
    print(f"rps={total / took:.1f}")
    print(f"ok_200={statuses[200]}")
    print(f"ok_200_per_s={statuses[200] / took:.1f}")
    print(f"limited_429={statuses[429]}")
    print(f"other={sum(other.values())}" + (f" {dict(sorted(other.items()))}" if other else ""))
    print(f"connection_errors={sum(errors.values())}" + (f" {dict(errors)}" if errors else ""))
    if ok_bytes:
        print(f"bytes_per_200={min(ok_bytes)}..{max(ok_bytes)}")
        print(f"mb_per_s_served={sum(ok_bytes) / took / 1e6:.1f}")
        page = json.loads(samples[200][0])
        items = page.get("items", [])
        print(f"items_per_page={len(items)}")
        print(f"next_present={'yes' if page.get('next') else 'no'}")
    else:
        print("bytes_per_200=none")
    if 429 in samples:
        body, h = samples[429]
        retry = {k.lower(): v for k, v in h.items()}.get("retry-after", "-")
        print(f"sample_429=retry-after {retry}; {body[:160].decode(errors='replace')}")
    for status in sorted(other):
        print(f"sample_{status}={samples[status][0][:300].decode(errors='replace')}")
    if latencies:
        latencies.sort()
        pct = lambda p: latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000
        print(f"latency_ms=p50 {pct(50):.0f}, p99 {pct(99):.0f}, max {latencies[-1] * 1000:.0f}")
    return 0


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "seed":
        sys.exit(seed(args[0], args[1], int(args[2]), int(args[3])))
    if mode == "load":
        sys.exit(load(args[0], args[1], int(args[2]), float(args[3])))
    sys.exit(f"unknown mode {mode}")
