"""Self-test of the golden-fixture generator's numpy parts (no torch, no transformers):
`python3 tools/golden/make_golden.py --self-test` (or `python3 tools/golden/self_test.py`).

Writes tiny GGUF files with its own minimal writer (below; independent of the reader), reads them back and checks:
  * metadata of every GGUF value type (including nested arrays and a non-default alignment), tensor infos, shapes;
  * dequantization of F32/F16/BF16/Q8_0/Q4_0 against hand-computed values, and of Q4_K/Q5_K/Q6_K against a
    per-element reference written from the block-format description (blocks built from chosen quants/scales);
  * refusal of an unsupported type, a bad magic and a truncated file;
  * the tiled -> grouped V-head permutation: composed with the forward (converter) permutation written from the
    spec formula it is the identity, and Kh=2, r=2 maps tiled j=1 to HF head 2;
  * the whole GGUF -> HF conversion: a random HF-layout model of each arch (qwen35moe with MTP block and tied
    output, qwen35 dense, qwen3next split and legacy ssm_in) is converted HF -> GGUF here (the converter direction,
    written independently from the spec), written, read back and converted GGUF -> HF by gguf_to_hf; every
    parameter must come back (exactly, A_log to float rounding), and the HF config kwargs must match;
  * a stray tensor is refused; the splitmix64 token generator matches its published first outputs.
Exit status 0 when every check passes.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import traceback
from typing import Any, Callable

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import gguf_read as gr  # noqa: E402
import gguf_to_hf as g2h  # noqa: E402


# ------------------------------------------------------------------------------------ minimal GGUF writer
class MiniGgufWriter:
    """Writes GGUF v3 little-endian. Array values are (element_type, items); nested array items are tuples too."""

    def __init__(self, alignment: int = 32) -> None:
        self.alignment = alignment
        self.kvs: list[tuple[str, int, Any]] = []
        self.tensors: list[tuple[str, list[int], int, bytes]] = []
        if alignment != 32:
            self.kv("general.alignment", gr.VT_UINT32, alignment)

    def kv(self, key: str, vtype: int, value: Any) -> None:
        self.kvs.append((key, vtype, value))

    def tensor(self, name: str, ne: list[int], gtype: int, data: bytes) -> None:
        self.tensors.append((name, list(ne), gtype, data))

    def tensor_f32(self, name: str, arr: np.ndarray) -> None:
        """`arr` in PyTorch layout; ne is its shape reversed."""
        self.tensor(name, list(reversed(arr.shape)), gr.T_F32, np.ascontiguousarray(arr, dtype="<f4").tobytes())

    @staticmethod
    def _str(s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _value(self, vtype: int, value: Any) -> bytes:
        if vtype in gr.SCALAR_TYPES:
            return struct.pack(gr.SCALAR_TYPES[vtype][0], value)
        if vtype == gr.VT_STRING:
            return self._str(value)
        if vtype == gr.VT_ARRAY:
            etype, items = value
            out = struct.pack("<IQ", etype, len(items))
            return out + b"".join(self._value(etype, it) for it in items)
        raise ValueError(vtype)

    def to_bytes(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs)))
        for key, vtype, value in self.kvs:
            out += self._str(key) + struct.pack("<I", vtype) + self._value(vtype, value)
        offset, blobs = 0, []
        for name, ne, gtype, data in self.tensors:
            out += self._str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            out += struct.pack("<IQ", gtype, offset)
            pad = (-len(data)) % self.alignment
            blobs.append(data + b"\0" * pad)
            offset += len(data) + pad
        out += b"\0" * ((-len(out)) % self.alignment)
        for blob in blobs:
            out += blob
        return bytes(out)

    def write(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.to_bytes())


# ------------------------------------------------------------------------------------------ test helpers
class Checker:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def check(self, cond: bool, what: str) -> None:
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)

    def raises(self, fn: Callable[[], Any], needle: str, what: str) -> None:
        try:
            fn()
        except gr.GgufError as exc:
            self.check(needle in str(exc), f"{what}: message {str(exc)!r} lacks {needle!r}")
            return
        self.failed.append(f"{what}: no GgufError raised")


def f16_bits(x: float) -> int:
    return int(np.array([x], dtype="<f2").view("<u2")[0])


def f32(x: Any) -> np.float32:
    return np.float32(x)


# --------------------------------------------------------------------------------------- metadata tests
def test_metadata(c: Checker, tmp: str) -> None:
    w = MiniGgufWriter(alignment=64)
    values = [
        ("t.u8", gr.VT_UINT8, 200), ("t.i8", gr.VT_INT8, -5), ("t.u16", gr.VT_UINT16, 60000),
        ("t.i16", gr.VT_INT16, -300), ("t.u32", gr.VT_UINT32, 4_000_000_000), ("t.i32", gr.VT_INT32, -2_000_000_000),
        ("t.f32", gr.VT_FLOAT32, 1.5), ("t.bool", gr.VT_BOOL, True), ("t.str", gr.VT_STRING, "h\u00e9llo \u4e16"),
        ("t.u64", gr.VT_UINT64, (1 << 63) + 5), ("t.i64", gr.VT_INT64, -(1 << 62)), ("t.f64", gr.VT_FLOAT64, 3.25),
    ]
    for key, vt, v in values:
        w.kv(key, vt, v)
    w.kv("t.arr_i32", gr.VT_ARRAY, (gr.VT_INT32, [1, -2, 3]))
    w.kv("t.arr_bool", gr.VT_ARRAY, (gr.VT_BOOL, [True, False, True]))
    w.kv("t.arr_str", gr.VT_ARRAY, (gr.VT_STRING, ["a", "", "ccc"]))
    w.kv("t.arr_nested", gr.VT_ARRAY, (gr.VT_ARRAY, [(gr.VT_UINT8, [1, 2]), (gr.VT_UINT8, [])]))
    w.kv("t.arr_f64", gr.VT_ARRAY, (gr.VT_FLOAT64, [0.5, -1.0]))
    data = np.arange(6, dtype=np.float32).reshape(2, 3)  # PyTorch [2, 3] = ggml {3, 2}
    w.tensor_f32("a", data)
    w.tensor_f32("b", np.array([7.0], dtype=np.float32))
    path = os.path.join(tmp, "meta.gguf")
    w.write(path)
    with gr.GgufFile(path) as g:
        c.check(g.version == 3 and g.alignment == 64, "version/alignment")
        for key, vt, v in values:
            c.check(g.metadata[key] == v and g.value_types[key] == vt, f"metadata {key}: {g.metadata.get(key)!r}")
        c.check(g.metadata["t.arr_i32"].tolist() == [1, -2, 3], "array i32")
        c.check(g.metadata["t.arr_bool"].tolist() == [True, False, True], "array bool")
        c.check(g.metadata["t.arr_str"] == ["a", "", "ccc"], "array string")
        nested = g.metadata["t.arr_nested"]
        c.check(len(nested) == 2 and nested[0].tolist() == [1, 2] and nested[1].size == 0, "nested array")
        c.check(g.metadata["t.arr_f64"].tolist() == [0.5, -1.0], "array f64")
        c.check(g.tensors["a"].ne == (3, 2) and g.tensors["a"].numpy_shape == (2, 3), "tensor ne order")
        c.check(np.array_equal(g.tensor_f32("a"), data), "f32 tensor data")
        c.check(g.tensors["b"].offset % 64 == 0 and g.tensor_f32("b")[0] == 7.0, "second tensor aligned")
    raw = open(path, "rb").read()
    bad = os.path.join(tmp, "bad.gguf")
    open(bad, "wb").write(b"GGUX" + raw[4:])
    c.raises(lambda: gr.GgufFile(bad), "not a GGUF file", "bad magic")
    open(bad, "wb").write(raw[:40])
    c.raises(lambda: gr.GgufFile(bad), "truncated", "truncated header")
    open(bad, "wb").write(raw[:-62])  # the last tensor has 4 data bytes + 60 padding bytes
    c.raises(lambda: gr.GgufFile(bad), "runs past the end", "truncated data")


# ---------------------------------------------------------------------------------------- dequant tests
def q4k_scales_bytes(sc: list[int], mn: list[int]) -> bytes:
    """Pack eight 6-bit scales and mins (the K-quant layout: j < 4 in bytes j / j+4 low 6 bits; j >= 4 split into
    the nibbles of byte j+4 and the top 2 bits of bytes j-4 / j)."""
    s = [0] * 12
    for t in range(4):
        s[t] = (sc[t] & 63) | ((sc[t + 4] >> 4) << 6)
        s[t + 4] = (mn[t] & 63) | ((mn[t + 4] >> 4) << 6)
        s[t + 8] = (sc[t + 4] & 15) | ((mn[t + 4] & 15) << 4)
    return bytes(s)


def test_simple_dequant(c: Checker, tmp: str) -> None:
    w = MiniGgufWriter()
    f16_vals = [1.0, -2.5, 2.0 ** -14, 65504.0, 0.0, -0.0, 2.0 ** -24]
    w.tensor("f16", [len(f16_vals)], gr.T_F16, np.array(f16_vals, dtype="<f2").tobytes())
    bf16_bits = [0x3F80, 0xC040, 0x0000, 0x7F7F]  # 1.0, -3.0, 0.0, max finite bf16
    w.tensor("bf16", [4], gr.T_BF16, np.array(bf16_bits, dtype="<u2").tobytes())
    # Q8_0: d = 0.5, q = -16..15  ->  x = q / 2
    q8 = struct.pack("<H", f16_bits(0.5)) + np.arange(-16, 16, dtype=np.int8).tobytes()
    w.tensor("q8", [32], gr.T_Q8_0, q8)
    # Q4_0: d = 2.0, qs[j] = j | (15-j) << 4  ->  x[j] = 2 (j-8), x[j+16] = 2 (7-j)
    q4 = struct.pack("<H", f16_bits(2.0)) + bytes((j | ((15 - j) << 4)) for j in range(16))
    w.tensor("q4", [32], gr.T_Q4_0, q4)
    w.tensor("q2k", [256], 10, bytes(84))  # Q2_K: known type, not dequantized
    path = os.path.join(tmp, "simple.gguf")
    w.write(path)
    with gr.GgufFile(path) as g:
        got = g.tensor_f32("f16")
        c.check(got.dtype == np.float32 and got.tolist() == f16_vals, f"f16 values {got.tolist()}")
        c.check(np.signbit(got[5]), "f16 -0.0 keeps its sign")
        c.check(g.tensor_f32("bf16").tolist() == [1.0, -3.0, 0.0, float(np.float32(3.3895313892515355e38))],
                f"bf16 values {g.tensor_f32('bf16').tolist()}")
        q8v = g.tensor_f32("q8")
        c.check(q8v[0] == -8.0 and q8v[31] == 7.5 and q8v[16] == 0.0 and np.array_equal(q8v, np.arange(-16, 16) / 2),
                f"q8_0 values {q8v[:4]}")
        q4v = g.tensor_f32("q4")
        want = [2.0 * (j - 8) for j in range(16)] + [2.0 * (7 - j) for j in range(16)]
        c.check(q4v.tolist() == want, f"q4_0 values {q4v.tolist()}")
        c.check(q4v[0] == -16.0 and q4v[15] == 14.0 and q4v[16] == 14.0 and q4v[31] == -16.0, "q4_0 hand values")
        c.raises(lambda: g.tensor_f32("q2k"), "Q2_K", "unsupported type refused")


def _kquant_blocks(rng: np.random.Generator, kind: str, n_blocks: int) -> tuple[bytes, np.ndarray]:
    """Builds `n_blocks` K-quant blocks from chosen parameters; returns (bytes, expected float32 values) where the
    expectation is computed per element from the chosen parameters, in ggml's float32 operation order."""
    raw, expect = bytearray(), []
    for _ in range(n_blocks):
        d = float(np.float16(rng.uniform(0.01, 0.2)))
        if kind == "Q6_K":
            q = rng.integers(-32, 32, size=256)  # signed 6-bit values
            sc = rng.integers(-128, 128, size=16)
            ql, qh = bytearray(128), bytearray(64)
            for e in range(256):
                h, wi = divmod(e, 128)
                k, l_ = divmod(wi, 32)
                u = int(q[e]) + 32
                ql_i = 64 * h + (32 if k in (1, 3) else 0) + l_
                ql[ql_i] |= (u & 15) << (4 if k >= 2 else 0)
                qh[32 * h + l_] |= (u >> 4) << (2 * k)
            raw += bytes(ql) + bytes(qh) + np.array(sc, dtype=np.int8).tobytes() + struct.pack("<H", f16_bits(d))
            for e in range(256):
                h, wi = divmod(e, 128)
                k, l_ = divmod(wi, 32)
                s = int(sc[8 * h + 2 * k + l_ // 16])
                expect.append(f32(f32(d) * f32(s)) * f32(int(q[e])))
            continue
        dmin = float(np.float16(rng.uniform(0.01, 0.2)))
        sc = [int(v) for v in rng.integers(0, 64, size=8)]
        mn = [int(v) for v in rng.integers(0, 64, size=8)]
        bits = 5 if kind == "Q5_K" else 4
        q = rng.integers(0, 1 << bits, size=256)
        qs, qh = bytearray(128), bytearray(32)
        for e in range(256):
            grp, wi = divmod(e, 64)
            hi, l_ = divmod(wi, 32)
            v = int(q[e])
            qs[32 * grp + l_] |= (v & 15) << (4 * hi)
            if bits == 5:
                qh[l_] |= (v >> 4) << (2 * grp + hi)
            sub = 2 * grp + hi
            expect.append(f32(f32(d) * f32(sc[sub])) * f32(v) - f32(f32(dmin) * f32(mn[sub])))
        raw += struct.pack("<HH", f16_bits(d), f16_bits(dmin)) + q4k_scales_bytes(sc, mn)
        raw += (bytes(qh) if bits == 5 else b"") + bytes(qs)
    return bytes(raw), np.array(expect, dtype=np.float32)


def test_kquants(c: Checker, tmp: str) -> None:
    rng = np.random.default_rng(7)
    # a hand-computed Q4_K element: d = 1, dmin = 0.5, sub-block 1 has scale 3 and min 2, element 32 is the high
    # nibble of qs[0] = 0x5A -> 5: x = 1*3*5 - 0.5*2 = 14
    sc, mn = [1, 3, 1, 1, 50, 1, 1, 1], [0, 2, 0, 0, 0, 0, 37, 0]
    block = struct.pack("<HH", f16_bits(1.0), f16_bits(0.5)) + q4k_scales_bytes(sc, mn) + bytes([0x5A] + [0] * 127)
    w = MiniGgufWriter()
    w.tensor("q4k_hand", [256], gr.T_Q4_K, block)
    expected = {}
    for kind, gtype in (("Q4_K", gr.T_Q4_K), ("Q5_K", gr.T_Q5_K), ("Q6_K", gr.T_Q6_K)):
        raw, exp = _kquant_blocks(rng, kind, 3)
        w.tensor(kind, [256, 3], gtype, raw)  # 3 rows of one super-block
        expected[kind] = exp
    path = os.path.join(tmp, "kq.gguf")
    w.write(path)
    with gr.GgufFile(path) as g:
        hand = g.tensor_f32("q4k_hand")
        c.check(hand[32] == 14.0, f"q4_K hand element 32 = {hand[32]}")
        c.check(hand[0] == 10.0, f"q4_K hand element 0 = {hand[0]} (1*1*10 - 0)")
        c.check(hand[1] == 0.0, f"q4_K hand element 1 = {hand[1]}")
        # element 4*32 = 128 is group 2 low nibble -> sub-block 4, scale 50 (uses the top-bit path), q = 0, min 0
        c.check(hand[128] == 0.0 and hand[160] == 0.0, "q4_K sub-blocks 4/5 with zero quants")
        # sub-block 6 (group 3 low) has min 37 (top-bit path): x = 1*1*0 - 0.5*37
        c.check(hand[192] == -18.5, f"q4_K element 192 = {hand[192]} (expected -18.5)")
        for kind, exp in expected.items():
            got = g.tensor_f32(kind)
            c.check(got.shape == (3, 256), f"{kind} shape {got.shape}")
            c.check(np.array_equal(got.reshape(-1), exp), f"{kind} differs from the per-element reference "
                                                           f"(max abs {np.max(np.abs(got.reshape(-1) - exp))})")


# ---------------------------------------------------------------------------------- permutation tests
def forward_tiled_source(n_k_heads: int, n_v_heads: int) -> np.ndarray:
    """Converter direction from model-spec §6.3.4: GGUF (tiled) head j holds HF head (j % Kh) * r + j / Kh."""
    r = n_v_heads // n_k_heads
    return np.array([(j % n_k_heads) * r + j // n_k_heads for j in range(n_v_heads)])


def test_permutation(c: Checker) -> None:
    fwd = forward_tiled_source(2, 4)
    c.check(int(fwd[1]) == 2, f"Kh=2, r=2: tiled j=1 holds HF head {fwd[1]} (expected 2)")
    inv = g2h.tiled_to_grouped_index(2, 4)
    c.check(int(inv[2]) == 1, f"Kh=2, r=2: HF head 2 sits at tiled position {inv[2]} (expected 1)")
    for kh, vh in ((1, 1), (2, 2), (2, 4), (3, 6), (4, 12), (16, 32), (16, 48), (16, 64)):
        fwd = forward_tiled_source(kh, vh)
        inv = g2h.tiled_to_grouped_index(kh, vh)
        hf = np.arange(vh) * 10 + 3
        gguf = hf[fwd]  # converter
        c.check(np.array_equal(gguf[inv], hf), f"inverse o forward != identity for Kh={kh}, Vh={vh}")
        c.check(np.array_equal(fwd[inv], np.arange(vh)) and np.array_equal(inv[fwd], np.arange(vh)),
                f"permutations not mutually inverse for Kh={kh}, Vh={vh}")
        if kh == vh:
            c.check(np.array_equal(inv, np.arange(vh)), "r=1 must be the identity")


# ---------------------------------------------------------------------------------- conversion tests
def tile_heads(x: np.ndarray, axis: int, head_size: int, kh: int, vh: int) -> np.ndarray:
    """Converter direction (HF grouped -> GGUF tiled), element by element along `axis`."""
    src = forward_tiled_source(kh, vh)
    out = np.empty_like(x)
    for j in range(vh):
        dst_sl = [slice(None)] * x.ndim
        src_sl = [slice(None)] * x.ndim
        dst_sl[axis] = slice(j * head_size, (j + 1) * head_size)
        src_sl[axis] = slice(int(src[j]) * head_size, (int(src[j]) + 1) * head_size)
        out[tuple(dst_sl)] = x[tuple(src_sl)]
    return out


def make_model(arch: str, rng: np.random.Generator, tied: bool, legacy: bool, shexp_2d: bool, mtp: bool,
               recurrent_array: bool, padded_vocab: bool) -> tuple[str, dict[str, np.ndarray], dict[str, Any]]:
    """Random HF-layout weights for a tiny model of `arch`, converted to GGUF here. Returns (path data, hf, dims)."""
    H, V, L, nh, nkv, hd, rot = 32, 40, 4, 2, 1, 8, 4
    kh, vh, dk = (2, 6, 4) if arch == "qwen3next" else (2, 4, 4)
    dv, K, E, top, I, Is, Id = 4, 4, 4, 2, 8, 8, 16
    r, kd, vd = vh // kh, kh * dk, vh * dv
    C = 2 * kd + vd
    types = ["linear_attention", "full_attention", "linear_attention", "full_attention"]  # interval 2

    def rnd(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:  # multiples of 2^-10 so that w + 1 - 1 is exact
        return (rng.integers(-256, 256, size=n) / 1024.0).astype(np.float32)

    hf: dict[str, np.ndarray] = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": norm_w(H)}
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"] if tied else rnd(V, H)
    w = MiniGgufWriter()
    p = arch + "."
    w.kv("general.architecture", gr.VT_STRING, arch)
    w.kv(p + "block_count", gr.VT_UINT32, L + (1 if mtp else 0))
    if mtp:
        w.kv(p + "nextn_predict_layers", gr.VT_UINT32, 1)
    for key, val in (("context_length", 4096), ("embedding_length", H), ("attention.head_count", nh),
                     ("attention.head_count_kv", nkv), ("attention.key_length", hd), ("attention.value_length", hd),
                     ("rope.dimension_count", rot), ("ssm.conv_kernel", K), ("ssm.state_size", dk),
                     ("ssm.group_count", kh), ("ssm.time_step_rank", vh), ("ssm.inner_size", vd)):
        w.kv(p + key, gr.VT_UINT32, val)
    w.kv(p + "attention.layer_norm_rms_epsilon", gr.VT_FLOAT32, 1e-6)
    w.kv(p + "rope.freq_base", gr.VT_FLOAT32, 1e7)
    if arch != "qwen3next":
        w.kv(p + "rope.dimension_sections", gr.VT_ARRAY, (gr.VT_INT32, [1, 1, 0, 0]))
    if recurrent_array:
        w.kv(p + "attention.recurrent_layers", gr.VT_ARRAY,
             (gr.VT_BOOL, [t == "linear_attention" for t in types] + ([True] if mtp else [])))
    else:
        w.kv(p + "full_attention_interval", gr.VT_UINT32, 2)
    if arch == "qwen35":
        w.kv(p + "feed_forward_length", gr.VT_UINT32, Id)
    else:
        for key, val in (("expert_count", E), ("expert_used_count", top), ("expert_feed_forward_length", I),
                         ("expert_shared_feed_forward_length", Is)):
            w.kv(p + key, gr.VT_UINT32, val)
    if padded_vocab:  # llama.cpp style: padded to V with [PAD<id>] fillers of type 5 (unused), id 0 is control
        w.kv("tokenizer.ggml.tokens", gr.VT_ARRAY,
             (gr.VT_STRING, [f"t{i}" for i in range(V - 8)] + [f"[PAD{i}]" for i in range(V - 8, V)]))
        w.kv("tokenizer.ggml.token_type", gr.VT_ARRAY, (gr.VT_INT32, [3] + [1] * (V - 9) + [5] * 8))
    w.tensor_f32("token_embd.weight", hf["model.embed_tokens.weight"])
    for i in range(L):
        m, b = f"model.layers.{i}.", f"blk.{i}."
        hf[m + "input_layernorm.weight"] = norm_w(H)
        hf[m + "post_attention_layernorm.weight"] = norm_w(H)
        w.tensor_f32(b + "attn_norm.weight", hf[m + "input_layernorm.weight"] + np.float32(1))
        if types[i] == "full_attention":
            a = m + "self_attn."
            hf[a + "q_proj.weight"], hf[a + "k_proj.weight"] = rnd(nh * 2 * hd, H), rnd(nkv * hd, H)
            hf[a + "v_proj.weight"], hf[a + "o_proj.weight"] = rnd(nkv * hd, H), rnd(H, nh * hd)
            hf[a + "q_norm.weight"], hf[a + "k_norm.weight"] = norm_w(hd), norm_w(hd)
            for gname, hname in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"),
                                 ("attn_output", "o_proj")):
                w.tensor_f32(b + gname + ".weight", hf[a + hname + ".weight"])
            w.tensor_f32(b + "attn_q_norm.weight", hf[a + "q_norm.weight"] + np.float32(1))
            w.tensor_f32(b + "attn_k_norm.weight", hf[a + "k_norm.weight"] + np.float32(1))
        else:
            g = m + "linear_attn."
            hf[g + "conv1d.weight"] = rnd(C, 1, K)
            hf[g + "dt_bias"], hf[g + "A_log"] = rnd(vh), rnd(vh) * np.float32(0.5)
            hf[g + "norm.weight"], hf[g + "out_proj.weight"] = rnd(dv), rnd(H, vd)
            ssm_a = -np.exp(hf[g + "A_log"]).astype(np.float32)
            conv = hf[g + "conv1d.weight"].reshape(C, K)
            out, dt = hf[g + "out_proj.weight"], hf[g + "dt_bias"]
            if arch == "qwen3next":
                hf[g + "in_proj_qkvz.weight"] = rnd(2 * kd + 2 * vd, H)
                hf[g + "in_proj_ba.weight"] = rnd(2 * vh, H)
                if legacy:
                    w.tensor_f32(b + "ssm_in.weight", hf[g + "in_proj_qkvz.weight"])
                else:  # de-interleave the per-K-group [q, k, v(r), z(r)] rows
                    per = 2 * dk + 2 * r * dv
                    blocks = [hf[g + "in_proj_qkvz.weight"][grp * per:(grp + 1) * per] for grp in range(kh)]
                    qs = [blk[:dk] for blk in blocks]
                    ks = [blk[dk:2 * dk] for blk in blocks]
                    vs = [blk[2 * dk:2 * dk + r * dv] for blk in blocks]
                    zs = [blk[2 * dk + r * dv:] for blk in blocks]
                    w.tensor_f32(b + "attn_qkv.weight", np.concatenate(qs + ks + vs))
                    w.tensor_f32(b + "attn_gate.weight", np.concatenate(zs))
                w.tensor_f32(b + "ssm_ba.weight", hf[g + "in_proj_ba.weight"])
            else:
                for hname, shape in (("in_proj_qkv", (2 * kd + vd, H)), ("in_proj_z", (vd, H)),
                                     ("in_proj_b", (vh, H)), ("in_proj_a", (vh, H))):
                    hf[g + hname + ".weight"] = rnd(*shape)
                qkv = hf[g + "in_proj_qkv.weight"]
                w.tensor_f32(b + "attn_qkv.weight",
                             np.concatenate([qkv[:2 * kd], tile_heads(qkv[2 * kd:], 0, dv, kh, vh)]))
                w.tensor_f32(b + "attn_gate.weight", tile_heads(hf[g + "in_proj_z.weight"], 0, dv, kh, vh))
                w.tensor_f32(b + "ssm_beta.weight", tile_heads(hf[g + "in_proj_b.weight"], 0, 1, kh, vh))
                w.tensor_f32(b + "ssm_alpha.weight", tile_heads(hf[g + "in_proj_a.weight"], 0, 1, kh, vh))
                conv = np.concatenate([conv[:2 * kd], tile_heads(conv[2 * kd:], 0, dv, kh, vh)])
                ssm_a, dt = tile_heads(ssm_a, 0, 1, kh, vh), tile_heads(dt, 0, 1, kh, vh)
                out = tile_heads(out, 1, dv, kh, vh)
            w.tensor_f32(b + "ssm_conv1d.weight", conv)  # ne {K, C}
            w.tensor_f32(b + "ssm_dt.bias", dt)
            w.tensor_f32(b + "ssm_a", ssm_a)
            w.tensor_f32(b + "ssm_norm.weight", hf[g + "norm.weight"])
            w.tensor_f32(b + "ssm_out.weight", out)
        w.tensor_f32(b + "post_attention_norm.weight", hf[m + "post_attention_layernorm.weight"] + np.float32(1))
        f = m + "mlp."
        if arch == "qwen35":
            hf[f + "gate_proj.weight"], hf[f + "up_proj.weight"] = rnd(Id, H), rnd(Id, H)
            hf[f + "down_proj.weight"] = rnd(H, Id)
            for gname, hname in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                w.tensor_f32(b + gname + ".weight", hf[f + hname + ".weight"])
        else:
            hf[f + "gate.weight"], hf[f + "experts.gate_up_proj"] = rnd(E, H), rnd(E, 2 * I, H)
            hf[f + "experts.down_proj"] = rnd(E, H, I)
            hf[f + "shared_expert.gate_proj.weight"], hf[f + "shared_expert.up_proj.weight"] = rnd(Is, H), rnd(Is, H)
            hf[f + "shared_expert.down_proj.weight"], hf[f + "shared_expert_gate.weight"] = rnd(H, Is), rnd(1, H)
            w.tensor_f32(b + "ffn_gate_inp.weight", hf[f + "gate.weight"])
            w.tensor_f32(b + "ffn_gate_exps.weight", hf[f + "experts.gate_up_proj"][:, :I, :])
            w.tensor_f32(b + "ffn_up_exps.weight", hf[f + "experts.gate_up_proj"][:, I:, :])
            w.tensor_f32(b + "ffn_down_exps.weight", hf[f + "experts.down_proj"])
            gate_sh = hf[f + "shared_expert_gate.weight"]
            w.tensor_f32(b + "ffn_gate_inp_shexp.weight", gate_sh if shexp_2d else gate_sh.reshape(H))
            for gname, hname in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"),
                                 ("ffn_down_shexp", "down_proj")):
                w.tensor_f32(b + gname + ".weight", hf[f + "shared_expert." + hname + ".weight"])
    if mtp:
        w.tensor_f32(f"blk.{L}.nextn.eh_proj.weight", rnd(H, 2 * H))
        w.tensor_f32(f"blk.{L}.attn_norm.weight", norm_w(H))
    w.tensor_f32("output_norm.weight", hf["model.norm.weight"] + np.float32(1))
    if not tied:
        w.tensor_f32("output.weight", hf["lm_head.weight"])
    dims = {"L": L, "H": H, "V": V, "types": types, "rot": rot, "hd": hd, "vd": vd, "kh": kh, "vh": vh, "E": E,
            "top": top, "I": I, "Is": Is, "Id": Id}
    return w, hf, dims


def test_conversion(c: Checker, tmp: str) -> None:
    cases = [
        ("qwen35moe", dict(tied=True, legacy=False, shexp_2d=False, mtp=True, recurrent_array=False,
                           padded_vocab=True)),
        ("qwen35moe", dict(tied=False, legacy=False, shexp_2d=True, mtp=False, recurrent_array=True,
                           padded_vocab=False)),
        ("qwen35", dict(tied=False, legacy=False, shexp_2d=False, mtp=False, recurrent_array=False,
                        padded_vocab=False)),
        ("qwen3next", dict(tied=False, legacy=False, shexp_2d=True, mtp=False, recurrent_array=False,
                           padded_vocab=False)),
        ("qwen3next", dict(tied=True, legacy=True, shexp_2d=False, mtp=False, recurrent_array=True,
                           padded_vocab=False)),
    ]
    for n, (arch, opts) in enumerate(cases):
        rng = np.random.default_rng(100 + n)
        w, hf, dims = make_model(arch, rng, **opts)
        path = os.path.join(tmp, f"model{n}.gguf")
        w.write(path)
        tag = f"{arch} case {n}"
        with gr.GgufFile(path) as g:
            hp = g2h.read_hparams(g)
            sd, report = g2h.hf_state_dict(g, hp)
        c.check(hp.n_layer == dims["L"] and hp.layer_types == dims["types"], f"{tag}: layers {hp.layer_types}")
        c.check(hp.tied_output == opts["tied"] and hp.gdn_legacy_ssm_in == opts["legacy"], f"{tag}: flags")
        want_pool = list(range(1, dims["V"] - 8)) if opts["padded_vocab"] else list(range(dims["V"]))
        c.check(hp.token_pool == want_pool and hp.n_vocab_real == len(want_pool), f"{tag}: token pool "
                                                                                   f"{hp.token_pool_rule}")
        c.check(sorted(sd) == sorted(hf), f"{tag}: keys differ: missing {sorted(set(hf) - set(sd))[:5]}, "
                                          f"extra {sorted(set(sd) - set(hf))[:5]}")
        for k in hf:
            if k not in sd:
                continue
            if sd[k].shape != hf[k].shape or sd[k].dtype != np.float32:
                c.check(False, f"{tag}: {k} shape {sd[k].shape} dtype {sd[k].dtype}, expected {hf[k].shape}")
            elif k.endswith("A_log"):
                c.check(np.allclose(sd[k], hf[k], rtol=1e-6, atol=1e-6), f"{tag}: {k} not close")
            else:
                c.check(np.array_equal(sd[k], hf[k]), f"{tag}: {k} differs (max abs "
                                                      f"{np.max(np.abs(sd[k] - hf[k]))})")
        c.check(report["norm_roundtrip_inexact"] == 0, f"{tag}: inexact norm round trips")
        c.check(len(report["skipped_mtp"]) == (2 if opts["mtp"] else 0), f"{tag}: skipped {report['skipped_mtp']}")
        kw = g2h.hf_config_kwargs(hp)
        rp = kw["rope_parameters"]
        c.check(kw["num_hidden_layers"] == dims["L"] and kw["layer_types"] == dims["types"], f"{tag}: config layers")
        c.check(rp["partial_rotary_factor"] == dims["rot"] / dims["hd"] and rp["rope_theta"] == 1e7,
                f"{tag}: rope {rp}")
        c.check(kw["tie_word_embeddings"] == opts["tied"] and kw["vocab_size"] == dims["V"], f"{tag}: tie/vocab")
        c.check(kw["linear_num_value_heads"] == dims["vh"] and kw["linear_value_head_dim"] == dims["vd"] // dims["vh"],
                f"{tag}: GDN dims")
        if arch == "qwen3next":
            c.check("mrope_section" not in rp and kw["norm_topk_prob"] and kw["mlp_only_layers"] == [],
                    f"{tag}: qwen3next config")
        else:
            c.check(rp["mrope_section"] == [1, 1, 0] and rp["mrope_interleaved"] is True, f"{tag}: mrope {rp}")
        if arch == "qwen35":
            c.check(kw["intermediate_size"] == dims["Id"] and "num_experts" not in kw, f"{tag}: dense config")
        else:
            c.check(kw["num_experts"] == dims["E"] and kw["num_experts_per_tok"] == dims["top"]
                    and kw["moe_intermediate_size"] == dims["I"] and kw["shared_expert_intermediate_size"] == dims["Is"],
                    f"{tag}: MoE config")
            c.check("intermediate_size" not in kw or arch == "qwen3next", f"{tag}: no intermediate_size for MoE 3.5")
        per = g2h.expert_state_dict_to_per_expert(sd)
        if arch != "qwen35":
            gu = sd["model.layers.0.mlp.experts.gate_up_proj"]
            c.check(np.array_equal(per["model.layers.0.mlp.experts.1.up_proj.weight"], gu[1, dims["I"]:]),
                    f"{tag}: per-expert split")
    # a tensor that belongs nowhere must be refused
    w, _, _ = make_model("qwen35", np.random.default_rng(1), tied=False, legacy=False, shexp_2d=False, mtp=False,
                         recurrent_array=False, padded_vocab=False)
    w.tensor_f32("blk.0.bogus.weight", np.zeros(4, dtype=np.float32))
    path = os.path.join(tmp, "stray.gguf")
    w.write(path)
    with gr.GgufFile(path) as g:
        hp = g2h.read_hparams(g)
        c.raises(lambda: g2h.hf_state_dict(g, hp), "blk.0.bogus.weight", "stray tensor refused")


def test_tokens(c: Checker) -> None:
    import make_golden as mg
    first = mg.splitmix64(0, 3)
    c.check(first == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F],
            f"splitmix64(0) = {[hex(v) for v in first]}")
    pool = list(range(5, 1000, 3))
    ids = mg.token_ids(96, pool, 20260101)
    c.check(len(ids) == 96 and all(i in pool for i in ids) and ids == mg.token_ids(96, pool, 20260101),
            "token ids from the pool and reproducible")
    c.check(mg.token_ids(2, [7, 9], 0) == [[7, 9][0xE220A8397B1DCDAF % 2], [7, 9][0x6E789E6AA1B965F4 % 2]],
            "token id rule pool[s % len]")
    lg = np.array([[0.0, 3.0, 3.0, -1.0, 5.0]], dtype=np.float32)
    tid, tv = mg.topk(lg, 3)
    c.check(tid.tolist() == [[4, 1, 2]] and tv.tolist() == [[5.0, 3.0, 3.0]], f"topk tie order {tid.tolist()}")


def main() -> int:
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("metadata", lambda: test_metadata(c, tmp)), ("simple dequant", lambda: test_simple_dequant(c, tmp)),
                         ("k-quants", lambda: test_kquants(c, tmp)), ("permutation", lambda: test_permutation(c)),
                         ("conversion", lambda: test_conversion(c, tmp)), ("tokens", lambda: test_tokens(c))):
            try:
                fn()
            except Exception:  # noqa: BLE001 - report and continue with the other groups
                c.failed.append(f"{name}: exception\n{traceback.format_exc()}")
    for f in c.failed:
        print(f"FAIL: {f}")
    print(f"self-test: {c.passed} checks passed, {len(c.failed)} failed (numpy {np.__version__})")
    return 0 if not c.failed else 1


if __name__ == "__main__":
    sys.exit(main())
