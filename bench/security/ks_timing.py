#!/usr/bin/env python3
"""What a timing probe learns from the prefix cache, with each defence off/on.

Against a running `pagoda serve` (loopback, api keys with a salting key), a
"victim" user sends a secret prompt; an "attacker" then sends a probe that
either shares the secret's first PROBE tokens (a right guess: a prefix hit when
nothing stops it) or shares nothing (a wrong guess: a miss). The time to the
first streamed token of both kinds is collected and compared with a
two-sample Kolmogorov-Smirnov test: a large statistic D and a small p-value
mean the attacker can tell a right guess from a wrong one.

Then the cost of the defence on honest traffic: requests sharing a system
prompt (the case the prefix cache exists for), closed loop at a fixed
concurrency: mean / p50 / p95 TTFT and requests per second.

Only the Python standard library (raw sockets). Prints one CSV row per run:
  config,attacker,d,p_value,hit_ms_median,miss_ms_median,n,cost_ttft_mean_ms,cost_ttft_p50_ms,cost_ttft_p95_ms,cost_rps

  ks_timing.py --port P --config NAME --attacker same|other-user [--samples 60]
"""
import argparse
import json
import math
import random
import socket
import statistics
import threading
import time

VOCAB = 4096


def request_bytes(prompt, key, user, stream=True, max_tokens=1):
    body = json.dumps({"model": "pagoda-tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": stream}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n")
    if user:
        head += f"X-Pagoda-User: {user}\r\n"
    return head.encode() + b"\r\n" + body


def ttft_ms(port, prompt, key, user):
    """Milliseconds from sending a streamed completion to its first data event."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    s.sendall(request_bytes(prompt, key, user))
    got = b""
    first = None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
        if first is None and b"data: {" in got:
            first = (time.perf_counter() - t0) * 1000.0
        if b"data: [DONE]" in got:
            break
    s.close()
    if not got.startswith(b"HTTP/1.1 200") or first is None:
        raise RuntimeError("bad answer: " + got[:300].decode(errors="replace"))
    return first


def ks_2samp(a, b):
    """Two-sample KS statistic and its asymptotic p-value (Kolmogorov distribution)."""
    a, b = sorted(a), sorted(b)
    n, m = len(a), len(b)
    i = j = 0
    d = 0.0
    while i < n and j < m:
        x = min(a[i], b[j])
        while i < n and a[i] <= x:
            i += 1
        while j < m and b[j] <= x:
            j += 1
        d = max(d, abs(i / n - j / m))
    ne = n * m / (n + m)
    lam = (math.sqrt(ne) + 0.12 + 0.11 / math.sqrt(ne)) * d
    if lam < 1e-3:
        return d, 1.0
    p = 0.0
    for k in range(1, 101):
        term = 2 * (-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam)
        p += term
        if abs(term) < 1e-12:
            break
    return d, min(max(p, 0.0), 1.0)


def fresh(rng, n):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def cost_run(port, rng, system_tokens, unique_tokens, users, requests, concurrency, key, salted):
    """Honest traffic: `users` end users share one system prompt; closed loop.
    Salted: each user in its own namespace (X-Pagoda-User), so each warms its own copy."""
    system = fresh(rng, system_tokens)
    name = (lambda i: f"user{i % users}") if salted else (lambda i: "")
    prompts = [(system + fresh(rng, unique_tokens), name(i)) for i in range(requests)]
    ttft_ms(port, system + fresh(rng, unique_tokens), key, name(0))  # the system prompt is cached once
    lat = []
    lock = threading.Lock()
    it = iter(prompts)

    def worker():
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            t = ttft_ms(port, nxt[0], key, nxt[1])
            with lock:
                lat.append(t)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return statistics.mean(lat), percentile(lat, 0.5), percentile(lat, 0.95), len(lat) / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--attacker", choices=["same", "other-user"], default="same",
                    help="same: the attacker shares the victim's namespace; other-user: a salted user of its own")
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--prompt-tokens", type=int, default=640)
    ap.add_argument("--probe-tokens", type=int, default=448, help="tokens a right guess shares with the secret")
    ap.add_argument("--cost-system-tokens", type=int, default=448, help="honest traffic: the shared system prompt")
    ap.add_argument("--cost-unique-tokens", type=int, default=192, help="honest traffic: each request's own tokens")
    ap.add_argument("--key", default="sk-app")
    ap.add_argument("--cost-requests", type=int, default=48)
    ap.add_argument("--cost-concurrency", type=int, default=4)
    ap.add_argument("--cost-users", type=int, default=8)
    ap.add_argument("--cost-salted", action="store_true", help="honest users send X-Pagoda-User")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # same: both in the tenant's own namespace (no header); other-user: each salted with its own id.
    victim_user = "" if a.attacker == "same" else "victim"
    attacker_user = "" if a.attacker == "same" else "attacker"
    for _ in range(3):  # warm-up
        ttft_ms(a.port, fresh(rng, a.prompt_tokens), a.key, attacker_user)
    hits, misses = [], []
    for i in range(a.samples):
        secret = fresh(rng, a.prompt_tokens)
        ttft_ms(a.port, secret, a.key, victim_user)
        right = secret[:a.probe_tokens] + fresh(rng, a.prompt_tokens - a.probe_tokens)
        wrong = fresh(rng, a.prompt_tokens)
        order = [(right, hits), (wrong, misses)]
        if i % 2:
            order.reverse()
        for prompt, into in order:
            into.append(ttft_ms(a.port, prompt, a.key, attacker_user))
    d, p = ks_2samp(hits, misses)
    cost = cost_run(a.port, rng, a.cost_system_tokens, a.cost_unique_tokens, a.cost_users, a.cost_requests,
                    a.cost_concurrency, a.key, a.cost_salted)
    print(f"{a.config},{a.attacker},{d:.3f},{p:.3g},{statistics.median(hits):.1f},{statistics.median(misses):.1f},"
          f"{a.samples},{cost[0]:.1f},{cost[1]:.1f},{cost[2]:.1f},{cost[3]:.2f}", flush=True)


if __name__ == "__main__":
    main()
