#!/usr/bin/env python3
"""kestrel_client: an independent Python client for kestreld (gRPC, kestrel.v1 and grpc.health.v1).

It shares no code with libkestrel-client: only the .proto files. The Python stubs are generated from
proto/kestrel/v1/kestrel.proto and proto/grpc/health/v1/health.proto into a folder of your choice (never committed):

    python3 tools/pyclient/kestrel_client.py gen-stubs build/pyclient

with Debian's protoc + grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc), or `python3 -m
grpc_tools.protoc` where that one understands proto3 `optional` (Debian 12's python3-grpc-tools 1.14 does not). The
build does this into <build>/pyclient. Then, with Debian's python3-grpcio:

    python3 tools/pyclient/kestrel_client.py --stubs build/pyclient health [--wait 30]
    python3 tools/pyclient/kestrel_client.py --stubs build/pyclient info
    python3 tools/pyclient/kestrel_client.py --stubs build/pyclient generate --prompt "Hello" -n 32 --temp 0 [--json]

--connect takes unix:///path (the default: $KESTREL_CONNECT or kestreld's default socket), a bare /path, or
tcp://host:port. Without --stubs, $KESTREL_PY_STUBS is used, else the stubs are generated into a temporary folder.
Errors: one line "kestrel_client: <STATUS>: <message>" on stderr and exit status 1 (2 for usage).
"""

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIRS = [os.path.join(REPO, "proto", "kestrel", "v1"), os.path.join(REPO, "proto", "grpc", "health", "v1")]
PROTO_FILES = [os.path.join(PROTO_DIRS[0], "kestrel.proto"), os.path.join(PROTO_DIRS[1], "health.proto")]
STUB_MODULES = ["kestrel_pb2", "kestrel_pb2_grpc", "health_pb2", "health_pb2_grpc"]


def generate_stubs(out_dir):
    """Writes kestrel_pb2(_grpc).py and health_pb2(_grpc).py into out_dir. Each .proto is compiled from its own folder
    so the modules are top-level (a generated `grpc/health/...` package would shadow the grpc library)."""
    os.makedirs(out_dir, exist_ok=True)
    includes = [f"-I{d}" for d in PROTO_DIRS]
    attempts = []
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc and plugin:
        attempts.append([protoc, *includes, f"--python_out={out_dir}", f"--grpc_out={out_dir}",
                         f"--plugin=protoc-gen-grpc={plugin}", *PROTO_FILES])
    attempts.append([sys.executable, "-m", "grpc_tools.protoc", *includes, f"--python_out={out_dir}",
                     f"--grpc_python_out={out_dir}", *PROTO_FILES])
    errors = []
    for cmd in attempts:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0 and all(os.path.exists(os.path.join(out_dir, m + ".py")) for m in STUB_MODULES):
            return
        errors.append(f"{' '.join(cmd[:3])}...: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    raise RuntimeError("cannot generate the Python stubs (install protobuf-compiler and protobuf-compiler-grpc): "
                       + "; ".join(errors))


def load_stubs(stubs_dir):
    """Imports the generated modules from stubs_dir; returns (kestrel_pb2, kestrel_pb2_grpc, health_pb2,
    health_pb2_grpc)."""
    missing = [m for m in STUB_MODULES if not os.path.exists(os.path.join(stubs_dir, m + ".py"))]
    if missing:
        raise RuntimeError(f"{stubs_dir} has no {', '.join(missing)}: run 'kestrel_client.py gen-stubs {stubs_dir}'")
    if stubs_dir not in sys.path:
        sys.path.insert(0, stubs_dir)
    import health_pb2  # noqa: E402  (generated)
    import health_pb2_grpc  # noqa: E402
    import kestrel_pb2  # noqa: E402
    import kestrel_pb2_grpc  # noqa: E402
    return kestrel_pb2, kestrel_pb2_grpc, health_pb2, health_pb2_grpc


def default_connect():
    """$KESTREL_CONNECT, else the first existing socket among kestreld's default places (as `kestrel` does)."""
    env = os.environ.get("KESTREL_CONNECT", "")
    if env:
        return env
    uid = os.getuid()
    system = "/run/kestrel/kestreld.sock"
    candidates = [system] if uid == 0 else []
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        candidates.append(os.path.join(xdg, "kestrel", "kestreld.sock"))
    candidates.append(f"/tmp/kestrel-{uid}/kestreld.sock")
    if uid != 0:
        candidates.append(system)
    for path in candidates:
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return "unix://" + path
        except OSError:
            pass
    return "unix://" + candidates[0]


def grpc_target(uri):
    """kestrel URI -> gRPC target string."""
    if uri.startswith("/"):
        return "unix://" + uri
    if uri.startswith("unix://"):
        return uri
    if uri.startswith("tcp://"):
        return uri[len("tcp://"):]
    raise ValueError(f"'{uri}': use unix:///path, /path or tcp://host:port (shm is libkestrel-client's only)")


class KestrelClient:
    """A thin synchronous client over one gRPC channel. Methods raise grpc.RpcError with the daemon's status."""

    def __init__(self, uri, stubs, timeout=None):
        import grpc

        self.grpc = grpc
        self.pb, pb_grpc, self.health_pb, health_grpc = stubs
        self.channel = grpc.insecure_channel(grpc_target(uri))
        self.stub = pb_grpc.KestrelStub(self.channel)
        self.health_stub = health_grpc.HealthStub(self.channel)
        self.timeout = timeout

    def close(self):
        self.channel.close()

    def health(self, service=""):
        """The serving status name: SERVING, NOT_SERVING, ... (grpc.RpcError when unreachable)."""
        r = self.health_stub.Check(self.health_pb.HealthCheckRequest(service=service), timeout=self.timeout)
        return self.health_pb.HealthCheckResponse.ServingStatus.Name(r.status)

    def model_info(self):
        return self.stub.GetModelInfo(self.pb.GetModelInfoRequest(), timeout=self.timeout)

    def server_status(self):
        return self.stub.GetServerStatus(self.pb.GetServerStatusRequest(), timeout=self.timeout)

    def tokenize(self, text, parse_special=False):
        return list(self.stub.Tokenize(self.pb.TokenizeRequest(text=text, parse_special=parse_special),
                                       timeout=self.timeout).tokens)

    def create_session(self, n_ctx=0, **sampling):
        req = self.pb.CreateSessionRequest(n_ctx=n_ctx, sampling=self.pb.SamplingParams(**sampling))
        return self.stub.CreateSession(req, timeout=self.timeout)

    def close_session(self, session_id):
        self.stub.CloseSession(self.pb.CloseSessionRequest(session_id=session_id), timeout=self.timeout)

    def step(self, session_id, tokens, top_logprobs=0, **sampling):
        req = self.pb.StepRequest(session_id=session_id, tokens=tokens, top_logprobs=top_logprobs,
                                  sampling=self.pb.SamplingParams(**sampling))
        return self.stub.Step(req, timeout=self.timeout)

    def generate(self, prompt=None, tokens=None, max_tokens=64, session_id=0, parse_special=False, stop=(),
                 stop_tokens=(), ignore_eos=False, top_logprobs=0, n_ctx=0, **sampling):
        """Yields GenerateChunk messages as they arrive; the last one carries finish_reason."""
        req = self.pb.GenerateRequest(session_id=session_id, parse_special=parse_special, max_tokens=max_tokens,
                                      sampling=self.pb.SamplingParams(**sampling), stop_strings=list(stop),
                                      stop_tokens=list(stop_tokens), ignore_eos=ignore_eos,
                                      top_logprobs=top_logprobs, n_ctx=n_ctx)
        if tokens is not None:
            req.tokens.ids.extend(tokens)
        else:
            req.text = prompt
        yield from self.stub.Generate(req, timeout=self.timeout)

    def finish_reason_name(self, reason):
        name = self.pb.FinishReason.Name(reason)
        return name[len("FINISH_REASON_"):].lower() if name.startswith("FINISH_REASON_") else name


def message_to_dict(msg):
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(msg, preserving_proto_field_name=True, including_default_value_fields=True)


def cmd_health(client, args):
    deadline = time.monotonic() + args.wait
    last = None
    while True:
        try:
            status = client.health()
        except client.grpc.RpcError as e:
            status = e.code().name
        if status != last:
            print(status, flush=True)
            last = status
        if status == "SERVING" or time.monotonic() >= deadline:
            return 0 if status == "SERVING" else 1
        time.sleep(0.05)


def cmd_info(client, args):
    info, status = client.model_info(), client.server_status()
    if args.json:
        print(json.dumps({"model": message_to_dict(info), "server": message_to_dict(status)}))
        return 0
    print(f"model:    {info.architecture} \"{info.name}\" ({info.model_path}), engine {info.engine}")
    print(f"vocab:    {info.n_vocab}, eos {list(info.eos_token_ids)}, context {info.n_ctx_train} "
          f"(sessions up to {info.max_session_ctx})")
    print(f"shape:    {info.n_layer} layers, embedding {info.n_embd}, {info.n_expert} experts "
          f"({info.n_expert_used} used)")
    for p in info.placement:
        print(f"  {p.component:<20} {p.device:<8} {p.bytes} bytes")
    print(f"server:   kestreld {status.version}, serving {status.serving}, sessions {status.sessions}/"
          f"{status.max_sessions}, ticks {status.ticks}, tokens {status.tokens_processed} processed "
          f"{status.tokens_generated} generated, up {status.uptime_s:.1f} s")
    return 0


def cmd_generate(client, args):
    sampling = {}
    for key, value in (("temperature", args.temp), ("top_k", args.top_k), ("top_p", args.top_p),
                       ("min_p", args.min_p), ("seed", args.seed)):
        if value is not None:
            sampling[key] = value
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    if (tokens is None) == (args.prompt is None):
        print("kestrel_client: give exactly one of --prompt and --tokens", file=sys.stderr)
        return 2
    text, ids, last = [], [], None
    t0 = time.monotonic()
    for chunk in client.generate(prompt=args.prompt, tokens=tokens, max_tokens=args.max_tokens,
                                 session_id=args.session, parse_special=args.special, stop=args.stop,
                                 ignore_eos=args.ignore_eos, top_logprobs=args.logprobs, **sampling):
        ids.extend(chunk.tokens)
        text.append(chunk.text)
        if not args.json and chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        last = chunk
    seconds = time.monotonic() - t0
    if last is None:
        print("kestrel_client: the stream ended without a final chunk", file=sys.stderr)
        return 1
    reason = client.finish_reason_name(last.finish_reason)
    if args.json:
        print(json.dumps({"text": "".join(text), "tokens": ids, "finish_reason": reason,
                          "prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
                          "session_id": last.session_id, "n_past": last.n_past, "seconds": seconds}))
    else:
        print()
        print(f"finish: {reason}; prompt {last.prompt_tokens} tokens; {last.completion_tokens} tokens in "
              f"{seconds:.3f} s", file=sys.stderr)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kestrel_client.py", description=__doc__.splitlines()[0])
    parser.add_argument("--connect", default=default_connect(), help="unix:///path, /path or tcp://host:port")
    parser.add_argument("--stubs", default=os.environ.get("KESTREL_PY_STUBS", ""),
                        help="folder of the generated stubs (default: $KESTREL_PY_STUBS, else a temporary folder)")
    parser.add_argument("--timeout", type=float, default=None, help="per-call deadline in seconds")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gen-stubs", help="generate the Python stubs into DIR")
    p.add_argument("dir")
    p = sub.add_parser("health", help="grpc.health.v1 Check; exit 0 when SERVING")
    p.add_argument("--wait", type=float, default=0.0, help="poll up to this many seconds for SERVING, printing "
                   "each status seen")
    p = sub.add_parser("info", help="model info and server status")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("generate", help="stream a generation")
    p.add_argument("-p", "--prompt")
    p.add_argument("--tokens", help="prompt token ids, comma-separated")
    p.add_argument("-n", "--max-tokens", type=int, default=64)
    p.add_argument("--session", type=int, default=0)
    p.add_argument("--special", action="store_true")
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--logprobs", type=int, default=0)
    p.add_argument("--temp", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--min-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    try:
        if args.command == "gen-stubs":
            generate_stubs(args.dir)
            return 0
        tmp = None
        stubs_dir = args.stubs
        if not stubs_dir:
            tmp = tempfile.TemporaryDirectory(prefix="kestrel-pystubs-")
            stubs_dir = tmp.name
            generate_stubs(stubs_dir)
        client = KestrelClient(args.connect, load_stubs(stubs_dir), timeout=args.timeout)
        try:
            return {"health": cmd_health, "info": cmd_info, "generate": cmd_generate}[args.command](client, args)
        finally:
            client.close()
            if tmp is not None:
                tmp.cleanup()
    except (RuntimeError, ValueError) as e:
        print(f"kestrel_client: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # grpc.RpcError carries the daemon's status; anything else is reported the same way
        code = getattr(e, "code", None)
        if callable(code):
            print(f"kestrel_client: {e.code().name}: {e.details()}", file=sys.stderr)
        else:
            print(f"kestrel_client: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
