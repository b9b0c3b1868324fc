#!/usr/bin/env python3
"""Loopback load test for HTTP fronts: N concurrent (streaming) clients.

Each client opens its own connection, sends one request and reads the whole
answer (Content-Length or chunked). Counted per client: status, connection
resets, refusals, timeouts, time to first byte and to the end. While it runs
the server process (--server-pid) is sampled for resident memory, threads and
CPU time. Prints a JSON summary (one line) and a short table.

  tools/http_load.py --port 8123 --clients 5000 --path /stream --server-pid PID
  tools/http_load.py --port 8000 --clients 5000 --path /v1/completions \
      --post '{"model": "llama_f32", "prompt": [1, 2, 3], "max_tokens": 8, "stream": true}'

Loopback only; every client has a deadline (--timeout).
"""

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time


def proc_sample(pid):
    rss_kb = threads = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except OSError:
        pass
    return rss_kb, threads


def proc_cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


async def read_answer(reader, deadline):
    """Reads one response; returns (status, body_bytes, first_byte_time)."""
    head = b""
    first = None
    while b"\r\n\r\n" not in head:
        chunk = await asyncio.wait_for(reader.read(65536), max(0.001, deadline - time.monotonic()))
        if not chunk:
            raise ConnectionResetError("closed before the head")
        if first is None:
            first = time.monotonic()
        head += chunk
    head, rest = head.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    body = rest
    if "content-length" in headers:
        need = int(headers["content-length"])
        while len(body) < need:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.001, deadline - time.monotonic()))
            if not chunk:
                raise ConnectionResetError("closed inside the body")
            body += chunk
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = await asyncio.wait_for(reader.read(65536), max(0.001, deadline - time.monotonic()))
            if not chunk:
                raise ConnectionResetError("closed inside the chunked body")
            body += chunk
    else:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.001, deadline - time.monotonic()))
            if not chunk:
                break
            body += chunk
    return status, len(body), first


async def one_client(args, request, results, state):
    start = time.monotonic()
    deadline = start + args.timeout
    outcome = {"status": None, "error": None, "ttfb": None, "total": None}
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(args.host, args.port),
                                                args.timeout)
        writer.write(request)
        await writer.drain()
        state["open"] += 1
        state["peak_open"] = max(state["peak_open"], state["open"])
        try:
            status, _, first = await read_answer(reader, deadline)
        finally:
            state["open"] -= 1
        outcome["status"] = status
        outcome["ttfb"] = (first - start) if first else None
        outcome["total"] = time.monotonic() - start
    except ConnectionResetError as e:
        outcome["error"] = "reset" if "closed" not in str(e) else "closed_early"
    except ConnectionRefusedError:
        outcome["error"] = "refused"
    except asyncio.TimeoutError:
        outcome["error"] = "timeout"
    except OSError as e:
        outcome["error"] = f"oserror_{e.errno}"
    finally:
        if writer is not None:
            writer.close()
    results.append(outcome)


async def sampler(pid, stop, samples):
    while not stop.is_set():
        samples.append(proc_sample(pid))
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except asyncio.TimeoutError:
            pass


async def main_async(args):
    if args.post is not None:
        body = args.post.encode()
        head = (f"POST {args.path} HTTP/1.1\r\nHost: {args.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n")
    else:
        body = b""
        head = f"GET {args.path} HTTP/1.1\r\nHost: {args.host}\r\n"
    for h in args.header:
        head += h + "\r\n"
    request = (head + "Connection: close\r\n\r\n").encode() + body

    results, samples = [], []
    state = {"open": 0, "peak_open": 0}
    stop = asyncio.Event()
    sample_task = asyncio.create_task(sampler(args.server_pid, stop, samples)) if args.server_pid else None
    cpu0 = proc_cpu_seconds(args.server_pid) if args.server_pid else 0.0
    rss0 = proc_sample(args.server_pid)[0] if args.server_pid else 0
    t0 = time.monotonic()
    tasks = []
    for i in range(args.clients):
        tasks.append(asyncio.create_task(one_client(args, request, results, state)))
        if args.ramp_s > 0:
            await asyncio.sleep(args.ramp_s / args.clients)
    await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    stop.set()
    if sample_task:
        await sample_task
    cpu = (proc_cpu_seconds(args.server_pid) - cpu0) if args.server_pid else 0.0

    statuses, errors = {}, {}
    for r in results:
        if r["status"] is not None:
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
        if r["error"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1

    def pct(values, p):
        values = sorted(v for v in values if v is not None)
        return round(values[min(len(values) - 1, int(p / 100 * len(values)))], 3) if values else None

    ok = [r for r in results if r["status"] == 200]
    refusals = [r for r in results if r["status"] in (429, 503)]
    summary = {
        "clients": args.clients,
        "statuses": statuses,
        "errors": errors,
        "peak_concurrent_open": state["peak_open"],
        "wall_s": round(wall, 2),
        "ttfb_p50_s": pct([r["ttfb"] for r in ok], 50),
        "ttfb_p99_s": pct([r["ttfb"] for r in ok], 99),
        "total_p50_s": pct([r["total"] for r in ok], 50),
        "total_max_s": pct([r["total"] for r in ok], 100),
        "refusal_p50_s": pct([r["total"] for r in refusals], 50),
        "refusal_max_s": pct([r["total"] for r in refusals], 100),
        "server_rss_start_mib": round(rss0 / 1024, 1),
        "server_rss_peak_mib": round(max((s[0] for s in samples), default=0) / 1024, 1),
        "server_threads_peak": max((s[1] for s in samples), default=0),
        "server_cpu_s": round(cpu, 2),
        "client_cpu_s": round(resource.getrusage(resource.RUSAGE_SELF).ru_utime
                              + resource.getrusage(resource.RUSAGE_SELF).ru_stime, 2),
    }
    print(json.dumps(summary))
    return 0 if not errors else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--path", default="/stream")
    p.add_argument("--post", default=None, help="JSON body: POST instead of GET")
    p.add_argument("--header", action="append", default=[], help="extra header line, e.g. 'Authorization: Bearer k'")
    p.add_argument("--timeout", type=float, default=120.0, help="per-client deadline, seconds")
    p.add_argument("--ramp-s", type=float, default=0.0, help="spread connection starts over this many seconds")
    p.add_argument("--server-pid", type=int, default=0)
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.clients + 256)), hard))
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
