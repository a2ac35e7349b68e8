#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), small valid and near-valid inputs in
each target's input format (see the head of each fuzz_<target>.cpp). The files are committed; run this again after a
target's input format changes:

    tests/fuzz/make_corpus.py tests/fuzz/corpus
"""
import os
import shutil
import struct
import sys


def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(n, v):
    return varint(n << 3) + varint(v)


def field_bytes(n, data):
    if isinstance(data, str):
        data = data.encode()
    return varint((n << 3) | 2) + varint(len(data)) + data


def field_float(n, f):
    return varint((n << 3) | 5) + struct.pack("<f", f)


def packed(n, values):
    return field_bytes(n, b"".join(varint(v) for v in values))


def sampling(**kw):
    out = b""
    floats = {"temperature": 1, "top_p": 3, "min_p": 4, "repetition_penalty": 5, "presence_penalty": 6,
              "frequency_penalty": 7}
    ints = {"top_k": 2, "penalty_last_n": 8, "seed": 9}
    for k, v in kw.items():
        out += field_float(floats[k], v) if k in floats else field_varint(ints[k], v)
    return out


def write(directory, name, data):
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


# ---- rpc_handlers: records [op u8][length u16][request bytes] -------------------------------------------------
OPS = {"GetModelInfo": 0, "GetServerStatus": 1, "Tokenize": 2, "Detokenize": 3, "CreateSession": 4,
       "CloneSession": 5, "ResetSession": 6, "CloseSession": 7, "Abort": 8, "Step": 9, "Generate": 10}


def call(op, payload=b""):
    return bytes([OPS[op]]) + struct.pack("<H", len(payload)) + payload


def rpc_corpus(d):
    write(d, "info-status", call("GetModelInfo") + call("GetServerStatus"))
    write(d, "tokenize", call("Tokenize", field_bytes(1, "Hello, world") + field_varint(2, 1)))
    write(d, "detokenize", call("Detokenize", packed(1, [72, 105, 0xE4, 0xBD])))
    write(d, "detokenize-bad-id", call("Detokenize", packed(1, [1, 2, 299, 300, (1 << 32) - 5])))
    session = call("CreateSession", field_varint(1, 32) + field_bytes(2, sampling(temperature=0.7, top_k=5)) +
                   field_varint(3, 60))
    write(d, "session-life", session + call("Step", field_varint(1, 1) + packed(2, [1, 2, 3]) + field_varint(4, 3)) +
          call("CloneSession", field_varint(1, 1)) + call("ResetSession", field_varint(1, 2)) +
          call("Abort", field_varint(1, 1)) + call("CloseSession", field_varint(1, 1)))
    write(d, "step-bad", session + call("Step", field_varint(1, 1) + packed(2, [5]) + field_varint(4, 21) +
                                        field_bytes(3, sampling(top_p=1.5))))
    write(d, "step-session-0", call("Step", packed(2, [5])))
    gen = (field_bytes(2, "Once upon a time") + field_varint(5, 8) + packed(7, [7, 9]) +
           field_bytes(8, "the end") + field_bytes(8, "\n\n") + field_varint(10, 2) +
           field_bytes(6, sampling(temperature=0.0, repetition_penalty=1.1, penalty_last_n=64, seed=42)))
    write(d, "generate-text", call("Generate", gen))
    write(d, "generate-tokens", session + call("Generate", field_varint(1, 1) + field_bytes(3, packed(1, [1, 2, 3])) +
                                               field_varint(5, 4) + field_varint(9, 1)))
    write(d, "generate-temporary", call("Generate", field_bytes(3, packed(1, [10, 11])) + field_varint(5, 3) +
                                        field_varint(11, 16)))
    write(d, "generate-bad", call("Generate", field_varint(1, 3) + field_bytes(2, "x") + field_varint(5, 0) +
                                  field_varint(11, 8) + b"".join(field_bytes(8, "s") for _ in range(17))))
    write(d, "garbage", call("Step", b"\x0f\x01\x02") + call("Generate", b"\xff\xff\xff"))


# ---- shm_ring: [warm u8][warm payload u16][tail mode u8][tail u64][pushes u8][sizes u32...][head mode u8]
# [head u64][ring bytes...] -------------------------------------------------------------------------------------
def record(kind, payload, request_id=1, flags=0, status=0, total=None):
    total = 32 + len(payload) if total is None else total
    h = struct.pack("<IHHQiIQ", total, kind, flags, request_id, status, 0, 0)
    body = h + payload
    return body + b"\0" * (-len(body) % 64)


def ring_input(warm, warm_payload, tail_mode, tail, sizes, head_mode, head, ring):
    out = struct.pack("<BHBQB", warm, warm_payload, tail_mode, tail, len(sizes))
    out += b"".join(struct.pack("<I", s) for s in sizes)
    return out + struct.pack("<BQ", head_mode, head) + ring


def ring_corpus(d):
    two = record(9, b"\x08\x01\x12\x01\x05") + record(10, b"abc" * 20, request_id=2)
    write(d, "two-records", ring_input(0, 0, 0, 0, [16], 0, len(two), two))
    write(d, "after-warm-up", ring_input(20, 16000, 0, 0, [100, 200000], 0, len(two), two))
    pad = record(0, b"", total=64)
    write(d, "pad-then-record", ring_input(0, 0, 0, 0, [], 0, 128, pad + record(3, b"hi")))
    write(d, "truncated", ring_input(0, 0, 0, 0, [], 0, 64, record(9, b"x" * 100, total=1000)[:64]))
    write(d, "huge-size", ring_input(0, 0, 0, 0, [], 0, 64, record(9, b"", total=0xFFFFFFF0)[:64]))
    write(d, "bad-tail", ring_input(3, 64, 1, 12345, [10, 10], 1, 7, b"\0" * 64))
    write(d, "wrap", ring_input(39, 65000, 0, 64, [262112, 0], 0, 4096, record(4, b"\x01" * 500)))


# ---- shm_control: [flags u8][type u16, status i32 when flag 8][body...] -------------------------------------------
def control(type_, status=0, size=0, owner=0, text=b"", magic=0x434D534B, version=1):
    text = text[:223]
    return struct.pack("<IHHiIQQ", magic, version, type_, status, 0, size, owner) + text + b"\0" * (224 - len(text))


def control_corpus(d):
    write(d, "hello-fd", bytes([0x05]) + control(1, size=2101248, owner=0x4B53484D00000001))
    write(d, "mapped", bytes([0x00]) + control(2))
    write(d, "refused", bytes([0x00]) + control(3, status=8, text=b"RESOURCE_EXHAUSTED: too many clients"))
    write(d, "made", bytes([0x08]) + struct.pack("<Hi", 3, 14) + b"kestreld is shutting down \xe2\x80\xa6")
    write(d, "bad-magic", bytes([0x06]) + control(1, magic=0x12345678))
    write(d, "bad-version", bytes([0x00]) + control(2, version=2))
    write(d, "short", bytes([0x01]) + control(2)[:100])
    write(d, "long", bytes([0x03]) + control(2) + b"extra")
    write(d, "empty", bytes([0x04]))


# ---- tokenizer: [flags u8][text] -------------------------------------------------------------------------------
def tokenizer_corpus(d):
    texts = {
        "english": (0, "The quick brown fox jumps over the lazy dog. It's 2024; isn't it?"),
        "code": (0, "def f(x):\n    return x**2  # square\n\n\tif x != 0: print(f'{x}')\n"),
        "numbers": (2, "123456789 3.14159 1,000,000 0x1F 2024-11-29"),
        "cjk": (0, "你好，世界！日本語のテキスト。한국어 텍스트"),
        "emoji": (2, "👍🏽 family: 👨‍👩‍👧‍👦 flags 🇫🇷"),
        "special": (1, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n</think>"),
        "special-unparsed": (0, "<|im_start|>user\n<|endoftext|>"),
        "whitespace": (3, "   \n\n\n\t\t  a  \r\n  b     "),
        "accents": (1, "naïve café — résumé, Ångström, Straße"),
    }
    for name, (flags, text) in texts.items():
        write(d, name, bytes([flags]) + text.encode())
    write(d, "invalid-utf8", bytes([0]) + b"ok \xff\xfe \xc3 \xe4\xbd end \xed\xa0\x80 \xf4\x90\x80\x80")


# ---- config: TOML ---------------------------------------------------------------------------------------------
def config_corpus(d, example):
    shutil.copyfile(example, os.path.join(d, "example.toml"))
    write(d, "small.toml", b'model = "/srv/m.gguf"\nengine = "cpu"\n[limits]\nmax_sessions = 8\n'
                           b'default_n_ctx = 512\n[sampling]\ntemperature = 0.0\nseed = 7\n')
    write(d, "listen.toml", b'[listen]\nsocket = "/run/k/k.sock"\nsocket_mode = "0o600"\nshm_socket = ""\n'
                            b'tcp = "127.0.0.1:7777"\n[log]\nlevel = "debug"\nformat = "text"\n')
    write(d, "bad-value.toml", b'[limits]\nmax_sessions = 0\nidle_ttl_s = -1\n')
    write(d, "bad-syntax.toml", b'[limits\nmax_sessions = = 3\n"unterminated\n')
    write(d, "unknown.toml", b'[gpu]\nslots = 4\n[cuda]\nslots = 2\ndevice = 1\n[cpu]\nthreads = 3\n')
    write(d, "types.toml", b'stop_timeout_s = 1.5\n[sampling]\ntop_k = "40"\ntop_p = 2\nmin_p = nan\n'
                           b'frequency_penalty = inf\n')


# ---- http: an HTTP/1.1 byte stream of pipelined requests --------------------------------------------------------
def http_request(method, target, body=None, headers=(), chunked=False):
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for h in headers:
        head += h + "\r\n"
    if body is None:
        return (head + "\r\n").encode()
    data = body.encode() if isinstance(body, str) else body
    if chunked:
        half = len(data) // 2
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (data[:half], data[half:]) if c)
        return (head + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + \
            chunks + b"0\r\n\r\n"
    return (head + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def http_corpus(d):
    write(d, "health-models", http_request("GET", "/health") + http_request("GET", "/v1/models") +
          http_request("GET", "/v1/models/fuzz-model?x=1") + http_request("GET", "/metrics"))
    write(d, "routes", http_request("POST", "/health", "{}") + http_request("GET", "/v1/completions") +
          http_request("GET", "/v1/nothing") + http_request("GET", "/v1/models/gpt-4",
                                                            headers=["Authorization: Bearer sk-x"]))
    write(d, "completion", http_request("POST", "/v1/completions",
                                        '{"model": "fuzz-model", "prompt": "Hello", "max_tokens": 5, '
                                        '"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\\n"]}'))
    write(d, "completion-tokens-echo", http_request("POST", "/v1/completions",
                                                    '{"prompt": [72, 105, 260, 299], "echo": true, "max_tokens": 4}'))
    write(d, "completion-stream", http_request("POST", "/v1/completions",
                                               '{"prompt": "abc", "max_tokens": 8, "stream": true, '
                                               '"stream_options": {"include_usage": true}, "logprobs": 3}'))
    write(d, "completion-long", http_request("POST", "/v1/completions",
                                             '{"prompt": "x", "max_tokens": 200, "logprobs": 5}') +
          http_request("POST", "/v1/completions", '{"prompt": "\\u0001\\u00ff\\"", "echo": true}'))
    write(d, "chat", http_request("POST", "/v1/chat/completions",
                                  '{"model": "fuzz-model", "messages": [{"role": "system", "content": "Be brief."}, '
                                  '{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], '
                                  '"max_completion_tokens": 6, "frequency_penalty": 0.5, "presence_penalty": 0.1}'))
    write(d, "chat-stream-logprobs", http_request("POST", "/v1/chat/completions",
                                                  '{"messages": [{"role": "user", "content": "\u65e5\u672c"}], '
                                                  '"stream": true, "logprobs": true, "top_logprobs": 20, '
                                                  '"max_tokens": 30}'))
    write(d, "chat-assistant-tools", http_request("POST", "/v1/chat/completions",
                                                  '{"messages": [{"role": "user", "content": "q"}, '
                                                  '{"role": "assistant", "content": null, "reasoning_content": "r", '
                                                  '"tool_calls": [{"id": "c1", "type": "function", "function": '
                                                  '{"name": "f", "arguments": "{}"}}]}, {"role": "tool", '
                                                  '"tool_call_id": "c1", "content": "42"}], "tools": [], "n": 2}'))
    write(d, "bad-json", http_request("POST", "/v1/completions", '{"prompt": "x", "max_tokens": 0, "wat": [1,') +
          http_request("POST", "/v1/chat/completions", '[]') +
          http_request("POST", "/v1/completions", '{"prompt": [], "stop": ["", "a"], "top_logprobs": 2}'))
    write(d, "chunked-continue", http_request("POST", "/v1/completions", '{"prompt": "chunked", "max_tokens": 2}',
                                              headers=["Expect: 100-continue"], chunked=True))
    write(d, "close", http_request("GET", "/health", headers=["Connection: close"]) + http_request("GET", "/health"))
    write(d, "malformed", b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcde" +
          b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{")
    write(d, "http10", b"GET /v1/models HTTP/1.0\r\n\r\n")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "systemd", "kestreld.toml.example")
    makers = {"rpc_handlers": rpc_corpus, "shm_ring": ring_corpus, "shm_control": control_corpus,
              "tokenizer": tokenizer_corpus, "config": lambda d: config_corpus(d, example), "http": http_corpus}
    for name, make in makers.items():
        d = os.path.join(root, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        make(d)
        files = os.listdir(d)
        print(f"{d}: {len(files)} files, {sum(os.path.getsize(os.path.join(d, f)) for f in files)} bytes")


if __name__ == "__main__":
    main()
