"""Pure-Python GGUF reader and dequantizer (numpy only) for Kestrel's golden-fixture generator.

Reads GGUF v2/v3 little-endian files: the header, every metadata key/value (all 13 GGUF value types, arrays of
arrays included), the tensor infos and the tensor data (through mmap, nothing is copied until a tensor is
dequantized). `GgufFile.tensor_f32(name)` returns a float32 numpy array whose shape is the ggml `ne` list reversed,
so a ggml `{n_in, n_out}` matrix comes back as the PyTorch `[out, in]` layout and `{n_in, n_out, E}` as
`[E, out, in]`.

Dequantized types (bit-exact with ggml's scalar reference for the same float32 operation order):
F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. Every other ggml type is recognised (its block geometry is known, so
offsets and sizes are checked) but `tensor_f32` refuses it with a message naming the type.

Used by tools/golden/make_golden.py; usable on its own: `python3 gguf_read.py FILE.gguf` prints the metadata and
the tensor table. Not thread-safe for concurrent close(); reading from several threads is fine.
"""

from __future__ import annotations

import mmap
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf.h `enum gguf_type`).
VT_UINT8, VT_INT8, VT_UINT16, VT_INT16, VT_UINT32, VT_INT32, VT_FLOAT32, VT_BOOL = 0, 1, 2, 3, 4, 5, 6, 7
VT_STRING, VT_ARRAY, VT_UINT64, VT_INT64, VT_FLOAT64 = 8, 9, 10, 11, 12

# Fixed-size scalar value types: struct format and numpy dtype (little-endian).
SCALAR_TYPES: dict[int, tuple[str, str]] = {
    VT_UINT8: ("<B", "<u1"),
    VT_INT8: ("<b", "<i1"),
    VT_UINT16: ("<H", "<u2"),
    VT_INT16: ("<h", "<i2"),
    VT_UINT32: ("<I", "<u4"),
    VT_INT32: ("<i", "<i4"),
    VT_FLOAT32: ("<f", "<f4"),
    VT_BOOL: ("<?", "<u1"),
    VT_UINT64: ("<Q", "<u8"),
    VT_INT64: ("<q", "<i8"),
    VT_FLOAT64: ("<d", "<f8"),
}
VALUE_TYPE_NAMES = {
    VT_UINT8: "u8", VT_INT8: "i8", VT_UINT16: "u16", VT_INT16: "i16", VT_UINT32: "u32", VT_INT32: "i32",
    VT_FLOAT32: "f32", VT_BOOL: "bool", VT_STRING: "string", VT_ARRAY: "array", VT_UINT64: "u64",
    VT_INT64: "i64", VT_FLOAT64: "f64",
}

# ggml tensor types: id -> (name, elements per block, bytes per block). Same table as core/gguf/ggml_type.cpp.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K, T_Q5_K, T_Q6_K, T_BF16 = 0, 1, 2, 8, 12, 13, 14, 30

QK_K = 256


class GgufError(Exception):
    """A malformed or unsupported GGUF file; the message names the offending key, tensor or type."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the fastest (row) dimension
    ggml_type: int
    offset: int  # relative to the start of the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


class _Cursor:
    """Bounds-checked little-endian reader over a buffer."""

    def __init__(self, buf: Any, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.size = len(buf)

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > self.size:
            raise GgufError(f"truncated file: reading {what} needs {n} bytes at offset {self.pos}, "
                            f"file has {self.size}")
        view = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        n = self.u64(what + " length")
        raw = bytes(self.take(n, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="surrogateescape")


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in SCALAR_TYPES:
        value = cur.scalar(SCALAR_TYPES[vtype][0], key)
        return bool(value) if vtype == VT_BOOL else value
    if vtype == VT_STRING:
        return cur.string(key)
    if vtype == VT_ARRAY:
        if depth > 8:
            raise GgufError(f"metadata key {key}: arrays nested deeper than 8 levels")
        etype = cur.u32(key + " array type")
        count = cur.u64(key + " array length")
        if etype in SCALAR_TYPES:
            fmt, dt = SCALAR_TYPES[etype]
            raw = cur.take(count * struct.calcsize(fmt), key)
            arr = np.frombuffer(raw, dtype=dt).copy()
            return arr.astype(bool) if etype == VT_BOOL else arr
        if etype == VT_STRING or etype == VT_ARRAY:
            return [_read_value(cur, etype, f"{key}[{i}]", depth + 1) for i in range(count)]
        raise GgufError(f"metadata key {key}: unknown array element type {etype}")
    raise GgufError(f"metadata key {key}: unknown value type {vtype}")


class GgufFile:
    """An opened GGUF file. `metadata` maps key -> value (Python scalars, str, numpy arrays for numeric arrays,
    lists for string/nested arrays); `value_types` maps key -> GGUF value type; `tensors` maps name -> TensorInfo
    (in file order). Owns an mmap of the file until close()."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "rb")
        try:
            self._mm: Any = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # empty file
            self._file.close()
            raise GgufError(f"{path}: cannot map the file ({exc})") from exc
        try:
            self._parse()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if getattr(self, "_mm", None) is not None:
            self._mm.close()
            self._mm = None
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "GgufFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _parse(self) -> None:
        cur = _Cursor(self._mm)
        magic = bytes(cur.take(4, "magic"))
        if magic != GGUF_MAGIC:
            raise GgufError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF'; big-endian GGUF "
                            f"files are not supported)")
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            raise GgufError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            vtype = cur.u32(f"type of {key}")
            if key in self.metadata:
                raise GgufError(f"{self.path}: duplicate metadata key {key}")
            self.value_types[key] = vtype
            self.metadata[key] = _read_value(cur, vtype, key)
        infos = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.u32(f"{name} n_dims")
            if n_dims < 1 or n_dims > 4:
                raise GgufError(f"tensor {name}: {n_dims} dimensions (1..4 allowed)")
            ne = tuple(cur.u64(f"{name} ne") for _ in range(n_dims))
            gtype = cur.u32(f"{name} type")
            offset = cur.u64(f"{name} offset")
            infos.append((name, ne, gtype, offset))
        align = self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GgufError(f"general.alignment = {align!r} is not a positive power of two")
        self.alignment = align
        self.data_start = (cur.pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, gtype, offset in infos:
            if gtype not in GGML_TYPES:
                raise GgufError(f"tensor {name}: unknown ggml type {gtype}")
            tname, block_elems, block_bytes = GGML_TYPES[gtype]
            if any(d <= 0 for d in ne):
                raise GgufError(f"tensor {name}: shape {list(ne)} has a zero dimension")
            if ne[0] % block_elems:
                raise GgufError(f"tensor {name}: ne[0] = {ne[0]} is not a multiple of the {tname} block size "
                                f"{block_elems}")
            n = 1
            for d in ne:
                n *= d
            nbytes = n // block_elems * block_bytes
            if offset % align:
                raise GgufError(f"tensor {name}: data offset {offset} is not aligned to {align}")
            if self.data_start + offset + nbytes > len(self._mm):
                raise GgufError(f"tensor {name}: data [{offset}, {offset + nbytes}) runs past the end of the file")
            if name in self.tensors:
                raise GgufError(f"duplicate tensor name {name}")
            self.tensors[name] = TensorInfo(name, ne, gtype, offset, nbytes)

    # ------------------------------------------------------------------------------------------------ access
    def raw_bytes(self, name: str) -> np.ndarray:
        """The tensor's raw data as a read-only uint8 view into the mapping (valid until close())."""
        info = self._info(name)
        start = self.data_start + info.offset
        return np.frombuffer(self._mm, dtype=np.uint8, count=info.nbytes, offset=start)

    def tensor_f32(self, name: str) -> np.ndarray:
        """Dequantized float32 copy, shape = reversed ggml ne (PyTorch layout). Refuses unsupported types."""
        info = self._info(name)
        flat = dequantize(self.raw_bytes(name), info.ggml_type, info.n_elements, what=f"tensor {name}")
        return flat.reshape(info.numpy_shape)

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GgufError(f"{self.path}: no tensor named {name}")
        return self.tensors[name]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


# ---------------------------------------------------------------------------------------------- dequantize
def _f16_to_f32(u16: np.ndarray) -> np.ndarray:
    return u16.astype("<u2").view("<f2").astype(np.float32)


def _blocks(raw: np.ndarray, block_bytes: int, n_blocks: int) -> np.ndarray:
    if raw.size != n_blocks * block_bytes:
        raise GgufError(f"expected {n_blocks} blocks of {block_bytes} bytes, got {raw.size} bytes")
    return raw.reshape(n_blocks, block_bytes)


def _half_field(b: np.ndarray, start: int) -> np.ndarray:
    """A little-endian f16 at byte `start` of every block, as float32 [n_blocks, 1]."""
    u = b[:, start].astype(np.uint16) | (b[:, start + 1].astype(np.uint16) << 8)
    return _f16_to_f32(u)[:, None]


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K super-blocks ([n, 12] bytes -> [n, 8] each).
    Sub-block j < 4: scale = s[j] & 63, min = s[j+4] & 63. j >= 4: scale = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
    min = (s[j+4] >> 4) | (s[j] >> 6) << 4."""
    s = scales.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int, what: str = "tensor") -> np.ndarray:
    """Dequantize `n_elements` values of `ggml_type` from the uint8 buffer `raw` into a float32 vector."""
    if ggml_type not in GGML_TYPES:
        raise GgufError(f"{what}: unknown ggml type {ggml_type}")
    tname, block_elems, block_bytes = GGML_TYPES[ggml_type]
    if n_elements % block_elems:
        raise GgufError(f"{what}: {n_elements} elements is not a multiple of the {tname} block size")
    nb = n_elements // block_elems
    raw = np.asarray(raw, dtype=np.uint8)
    if ggml_type == T_F32:
        return raw.view("<f4").astype(np.float32)[:n_elements].copy()
    if ggml_type == T_F16:
        return raw.view("<f2").astype(np.float32)[:n_elements]
    if ggml_type == T_BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)[:n_elements].copy()
    b = _blocks(raw, block_bytes, nb)
    if ggml_type == T_Q8_0:
        # block: f16 d, int8 qs[32]; x = d * q
        d = _half_field(b, 0)
        q = b[:, 2:34].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if ggml_type == T_Q4_0:
        # block: f16 d, u8 qs[16]; x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
        d = _half_field(b, 0)
        qs = b[:, 2:18]
        q = np.concatenate([(qs & 0xF).astype(np.int16) - 8, (qs >> 4).astype(np.int16) - 8], axis=1)
        return (d * q.astype(np.float32)).reshape(-1)
    if ggml_type == T_Q4_K:
        # block: f16 d, f16 dmin, u8 scales[12], u8 qs[128]; 4 groups of 64: low nibbles of qs[32g..32g+32) are
        # sub-block 2g, high nibbles sub-block 2g+1; x = (d*sc) * q - (dmin*m)
        d, dmin = _half_field(b, 0), _half_field(b, 2)
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 16:144].reshape(nb, 4, 32)
        q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
        d1 = (d * sc.astype(np.float32))[:, :, None]
        m1 = (dmin * mn.astype(np.float32))[:, :, None]
        return (d1 * q - m1).astype(np.float32).reshape(-1)
    if ggml_type == T_Q5_K:
        # block: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]; like Q4_K plus a fifth bit: for group g,
        # the low-nibble element l takes bit 2g of qh[l], the high-nibble element bit 2g+1 (adds 16)
        d, dmin = _half_field(b, 0), _half_field(b, 2)
        sc, mn = _scale_min_k4(b[:, 4:16])
        qh = b[:, 16:48]
        qs = b[:, 48:176].reshape(nb, 4, 32)
        groups = []
        for g in range(4):
            lo = (qs[:, g] & 0xF).astype(np.int16) + (((qh >> (2 * g)) & 1).astype(np.int16) << 4)
            hi = (qs[:, g] >> 4).astype(np.int16) + (((qh >> (2 * g + 1)) & 1).astype(np.int16) << 4)
            groups += [lo, hi]
        q = np.stack(groups, axis=1).astype(np.float32)  # [nb, 8, 32]
        d1 = (d * sc.astype(np.float32))[:, :, None]
        m1 = (dmin * mn.astype(np.float32))[:, :, None]
        return (d1 * q - m1).astype(np.float32).reshape(-1)
    if ggml_type == T_Q6_K:
        # block: u8 ql[128], u8 qh[64], i8 scales[16], f16 d. Two halves of 128 elements; in half h, for l < 32:
        # element l      = (ql[64h+l] & 15)    | ((qh[32h+l] >> 0) & 3) << 4, scale index 8h + l/16
        # element l + 32 = (ql[64h+l+32] & 15) | ((qh[32h+l] >> 2) & 3) << 4, scale index 8h + l/16 + 2
        # element l + 64 = (ql[64h+l] >> 4)    | ((qh[32h+l] >> 4) & 3) << 4, scale index 8h + l/16 + 4
        # element l + 96 = (ql[64h+l+32] >> 4) | ((qh[32h+l] >> 6) & 3) << 4, scale index 8h + l/16 + 6
        # x = (d * scale) * (q - 32)
        ql = b[:, 0:128].reshape(nb, 2, 64)
        qh = b[:, 128:192].reshape(nb, 2, 32)
        scales = b[:, 192:208].view(np.int8).astype(np.float32).reshape(nb, 2, 8)
        d = _half_field(b, 208)[:, :, None, None]  # [nb,1,1,1]
        lo, hi = ql[:, :, 0:32], ql[:, :, 32:64]
        q = np.stack([
            (lo & 0xF) | (((qh >> 0) & 3) << 4),
            (hi & 0xF) | (((qh >> 2) & 3) << 4),
            (lo >> 4) | (((qh >> 4) & 3) << 4),
            (hi >> 4) | (((qh >> 6) & 3) << 4),
        ], axis=2).astype(np.int16) - 32  # [nb, 2, 4, 32]
        # scale for (half h, quarter k, l) = scales[h, 2k + l // 16]
        sc = scales.reshape(nb, 2, 4, 2)  # [h, k, l//16]
        sc_full = np.repeat(sc, 16, axis=3)  # [nb, 2, 4, 32]
        dsc = (d * sc_full).astype(np.float32)
        return (dsc * q.astype(np.float32)).astype(np.float32).reshape(-1)
    raise GgufError(f"{what}: ggml type {tname} cannot be dequantized by this tool (supported: F32, F16, BF16, "
                    f"Q8_0, Q4_0, Q4_K, Q5_K, Q6_K); write the golden model with one of those types")


def describe_value(value: Any, max_items: int = 4) -> str:
    if isinstance(value, np.ndarray):
        head = ", ".join(repr(v.item()) for v in value[:max_items])
        return f"[{value.dtype} x {value.size}] [{head}{', ...' if value.size > max_items else ''}]"
    if isinstance(value, list):
        head = ", ".join(describe_value(v) for v in value[:max_items])
        return f"[x {len(value)}] [{head}{', ...' if len(value) > max_items else ''}]"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    return repr(value)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gguf_read.py FILE.gguf", file=sys.stderr)
        return 2
    with GgufFile(argv[1]) as f:
        print(f"GGUF v{f.version}, {len(f.metadata)} keys, {len(f.tensors)} tensors, alignment {f.alignment}")
        for k, v in f.metadata.items():
            print(f"  {k} ({VALUE_TYPE_NAMES.get(f.value_types[k], '?')}) = {describe_value(v)}")
        for t in f.tensors.values():
            print(f"  {t.name:40s} {t.type_name:6s} ne={list(t.ne)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
