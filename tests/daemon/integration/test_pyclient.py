#!/usr/bin/env python3
"""Integration: the independent Python client (tools/pyclient/kestrel_client.py, Debian's python3-grpcio, stubs
generated from the .proto files) against a real kestreld.

Checks: health goes to SERVING (never anything but UNAVAILABLE / NOT_SERVING before); GetModelInfo; a greedy
Generate equals the `kestrel` CLI's (libkestrel-client) token for token, through the module and through its CLI; a
bad token id is INVALID_ARGUMENT; on SIGTERM with a stream in flight health turns NOT_SERVING, the stream ends with
FINISH_REASON_SHUTDOWN after the 2 s stop timeout and kestreld exits 0.

    test_pyclient.py --kestreld BIN --kestrel BIN --model GGUF --stubs DIR
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PYCLIENT = os.path.join(REPO, "tools", "pyclient", "kestrel_client.py")
sys.path.insert(0, os.path.dirname(PYCLIENT))
import kestrel_client  # noqa: E402

failures = []


def check(cond, what):
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kestreld", required=True)
    ap.add_argument("--kestrel", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--stubs", required=True)
    args = ap.parse_args()

    import grpc

    stubs = kestrel_client.load_stubs(args.stubs)
    tmp = tempfile.mkdtemp(prefix="kestrel-it-py-")
    sock = os.path.join(tmp, "kestreld.sock")
    uri = "unix://" + sock
    log = open(os.path.join(tmp, "kestreld.log"), "w")
    daemon = subprocess.Popen([args.kestreld, "--model", args.model, "--socket", sock, "--shm-socket",
                               os.path.join(tmp, "kestreld-shm.sock"), "--cache-dir", os.path.join(tmp, "cache"),
                               "--stop-timeout", "2", "--log-format", "text"], stdout=log, stderr=log)
    try:
        client = kestrel_client.KestrelClient(uri, stubs, timeout=5)
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                status = client.health()
            except grpc.RpcError as e:
                status = e.code().name
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == "SERVING":
                break
            time.sleep(0.02)
        print("health seen while starting:", " -> ".join(seen))
        check(seen and seen[-1] == "SERVING", "health reaches SERVING")
        check(all(s in ("UNAVAILABLE", "NOT_SERVING", "SERVING") for s in seen), "no other health status on the way")

        info = client.model_info()
        check(info.architecture == "qwen35moe" and info.n_vocab > 0, f"GetModelInfo: {info.architecture}, "
              f"vocab {info.n_vocab}")

        chunks = list(client.generate(prompt="Hello", max_tokens=12, ignore_eos=True, temperature=0.0))
        py_tokens = [t for c in chunks for t in c.tokens]
        py_text = "".join(c.text for c in chunks)
        check(chunks[-1].finish_reason == stubs[0].FINISH_REASON_MAX_TOKENS, "Generate ends with MAX_TOKENS")
        check(len(py_tokens) == 12 and chunks[-1].completion_tokens == 12, "Generate streams 12 tokens")

        cli = subprocess.run([args.kestrel, "generate", "--connect", uri, "--prompt", "Hello", "-n", "12",
                              "--ignore-eos", "--temp", "0", "--json"], capture_output=True, text=True)
        check(cli.returncode == 0, f"kestrel generate runs ({cli.stderr.strip()})")
        if cli.returncode == 0:
            j = json.loads(cli.stdout)
            check(j["tokens"] == py_tokens, "Python client and libkestrel-client generate the same tokens")
            check(j["text"] == py_text, "... and the same text")

        pycli = subprocess.run([sys.executable, PYCLIENT, "--connect", uri, "--stubs", args.stubs, "generate",
                                "--prompt", "Hello", "-n", "12", "--ignore-eos", "--temp", "0", "--json"],
                               capture_output=True, text=True)
        check(pycli.returncode == 0, f"kestrel_client.py generate runs ({pycli.stderr.strip()})")
        if pycli.returncode == 0:
            check(json.loads(pycli.stdout)["tokens"] == py_tokens, "kestrel_client.py generate gives the same tokens")
        health_cli = subprocess.run([sys.executable, PYCLIENT, "--connect", uri, "--stubs", args.stubs, "health"],
                                    capture_output=True, text=True)
        check(health_cli.returncode == 0 and health_cli.stdout.strip() == "SERVING", "kestrel_client.py health")

        try:
            list(client.generate(tokens=[-1], max_tokens=4))
            check(False, "a negative token id is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"negative token id: {e.code().name}: {e.details()}")

        # Drain: a stream far longer than the 2 s stop timeout is in flight when SIGTERM arrives.
        long_client = kestrel_client.KestrelClient(uri, stubs, timeout=None)
        got_first = threading.Event()
        result = {}

        def stream():
            try:
                last = None
                for c in long_client.generate(prompt="Keep going", max_tokens=1000000, ignore_eos=True,
                                              n_ctx=info.max_session_ctx, temperature=0.0):
                    got_first.set()
                    last = c
                result["finish"] = last.finish_reason if last is not None else None
            except grpc.RpcError as e:
                result["error"] = f"{e.code().name}: {e.details()}"
            got_first.set()

        t = threading.Thread(target=stream)
        t.start()
        check(got_first.wait(30), "the long stream started")
        t0 = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        drain_seen = []  # distinct consecutive statuses (SERVING until the daemon has handled the signal)
        while daemon.poll() is None and time.monotonic() - t0 < 10:
            try:
                status = client.health()
            except grpc.RpcError as e:
                status = e.code().name
            if not drain_seen or drain_seen[-1] != status:
                drain_seen.append(status)
            time.sleep(0.02)
        t.join(15)
        try:
            rc = daemon.wait(timeout=max(0.1, 10 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            rc = None
        elapsed = time.monotonic() - t0
        print("health seen while draining:", " -> ".join(drain_seen))
        after = drain_seen[drain_seen.index("NOT_SERVING"):] if "NOT_SERVING" in drain_seen else []
        check(bool(after) and "SERVING" not in after, "health turns NOT_SERVING while draining, and stays so")
        check(result.get("finish") == stubs[0].FINISH_REASON_SHUTDOWN,
              f"the in-flight stream ends with FINISH_REASON_SHUTDOWN ({result})")
        check(rc == 0, f"kestreld exits 0 after SIGTERM (status {rc}, {elapsed:.2f} s)")
        check(elapsed < 2 + 5, f"kestreld exits within the stop timeout ({elapsed:.2f} s)")
        long_client.close()
        client.close()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
        if failures:
            print(open(os.path.join(tmp, "kestreld.log")).read()[-4000:])
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
