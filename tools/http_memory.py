#!/usr/bin/env python3
# Resident memory and latency of `coli serve --http` around oversized
# requests, for docs/benchmarks.md. Standard library only (Python 3.8+);
# Linux (reads /proc/PID/status). Run from the repository root after
# `cargo build --release`:
#   python3 tools/http_memory.py [--coli target/release/coli] [--rounds 3]
#
# It starts the server on models/colibri-tiny with HOME and the XDG
# directories in a temporary directory, then, per round: reads VmRSS idle,
# sends three ~8 MB chat bodies at once (far over the context) while
# sampling VmRSS every 5 ms and timing a 32-token greedy chat sent
# 0.1 s after them, and reads VmRSS again once the three were answered (after
# a 2 s pause, so freed memory has had its chance to go). It prints one
# line per round and the statuses seen.
import argparse
import http.client
import json
import os
import re
import subprocess
import tempfile
import threading
import time

BIG = 8_000_000


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t = time.monotonic()
    c.request("POST", path, body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, time.monotonic() - t


def big_body():
    content = "river bank " * (BIG // 11)
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 8}).encode()


def small_body():
    return json.dumps(
        {"messages": [{"role": "user", "content": "What does river mean?"}], "max_tokens": 32,
         "temperature": 0, "seed": 1}
    ).encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="coli-http-memory-")
    env = dict(os.environ, HOME=home, XDG_STATE_HOME=f"{home}/state", XDG_DATA_HOME=f"{home}/data",
               XDG_CACHE_HOME=f"{home}/cache", COLI_MODELS=f"{home}/models")
    env.pop("COLI_MODEL", None)
    srv = subprocess.Popen(
        [args.coli, "serve", "--model", "models/colibri-tiny", "--http", "127.0.0.1:0", "--threads", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    port = None
    for line in srv.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
    body = big_body()
    print(f"body {len(body)} bytes, server pid {srv.pid}")
    # Warm up: one small chat, so idle includes what any request leaves.
    post(port, "/v1/chat/completions", small_body())
    print("round  idle_MB  peak_MB  after_MB  big_s(max)  small_chat_s  statuses")
    for rnd in range(args.rounds):
        time.sleep(2)
        idle = rss_kb(srv.pid)
        peak = [idle]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_kb(srv.pid))
                time.sleep(0.005)

        results = []
        sampler = threading.Thread(target=sample)
        sampler.start()
        bigs = [threading.Thread(target=lambda: results.append(post(port, "/v1/chat/completions", body)))
                for _ in range(3)]
        for t in bigs:
            t.start()
        time.sleep(0.1)  # the three are on their way
        small = post(port, "/v1/chat/completions", small_body())
        for t in bigs:
            t.join()
        done.set()
        sampler.join()
        time.sleep(2)
        after = rss_kb(srv.pid)
        statuses = sorted(r[0] for r in results) + [small[0]]
        print(f"{rnd:5}  {idle / 1024:7.0f}  {peak[0] / 1024:7.0f}  {after / 1024:8.0f}  "
              f"{max(r[2] for r in results):10.2f}  {small[2]:12.2f}  {statuses}")
    srv.terminate()
    srv.wait(timeout=60)


if __name__ == "__main__":
    main()
