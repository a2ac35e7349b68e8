"""GGUF (llama.cpp layout, model-spec.md §6) -> Hugging Face transformers weights and config, numpy only.

Three pieces, all free of torch/transformers so they can be tested anywhere:
  * `read_hparams(gguf)`   : the model-spec §6.1 metadata of a qwen35moe / qwen35 / qwen3next file, checked.
  * `hf_config_kwargs(hp)` : the keyword arguments of the matching transformers 5.x text config
                             (Qwen3_5MoeTextConfig / Qwen3_5TextConfig / Qwen3NextConfig).
  * `hf_state_dict(gguf, hp)`: every HF parameter as a float32 numpy array under its HF name, produced by undoing
                             llama.cpp's converter transforms (model-spec §6.3):
      - norm weights: GGUF stores 1 + w for every *norm.weight except ssm_norm (HF `linear_attn.norm`): subtract 1;
      - A_log = log(-ssm_a); conv1d {K, C} -> [C, 1, K];
      - qwen35*: V heads are stored tiled (GGUF head j = HF head (j % Kh) * r + j / Kh); put them back in HF's
        grouped order in the V rows of attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt.bias, the V
        channels of ssm_conv1d and the input columns of ssm_out;
      - qwen3next: in_proj_qkvz is rebuilt per K-group [q | k | v(r heads) | z(r heads)] from attn_qkv + attn_gate
        (or taken from a legacy ssm_in as is); in_proj_ba = ssm_ba as is;
      - MoE: ffn_{gate,up}_exps [E, I, H] -> experts.gate_up_proj [E, 2I, H] (gate rows first), ffn_down_exps
        [E, H, I] -> experts.down_proj; router ffn_gate_inp -> mlp.gate.weight; ffn_gate_inp_shexp {H} or {H,1}
        -> shared_expert_gate.weight [1, H].
The state dict also reports which GGUF tensors were consumed and which were skipped (MTP blocks), so the caller can
refuse a file with tensors nobody read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gguf_read import VT_FLOAT32, GgufError, GgufFile

ARCHS = ("qwen35moe", "qwen35", "qwen3next")


@dataclass
class Hparams:
    arch: str
    n_layer: int
    n_block: int
    n_nextn: int
    n_embd: int
    n_vocab: int  # rows of token_embd.weight
    n_vocab_real: int  # ids the tokenizer defines as ordinary tokens (size of token_pool)
    n_ctx_train: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_theta: float
    rope_sections: list[int]
    rms_eps: float
    ssm_conv_kernel: int
    ssm_d_state: int  # dk
    ssm_n_k_heads: int  # Kh
    ssm_n_v_heads: int  # Vh
    ssm_inner: int  # Vh * dv
    n_expert: int
    n_expert_used: int
    n_ff_expert: int
    n_ff_shared: int
    n_ff_dense: int
    layer_types: list[str]  # "linear_attention" | "full_attention", one per main layer
    tied_output: bool
    gdn_legacy_ssm_in: bool
    token_pool: list[int] = field(default_factory=list)  # ascending ids the golden sequence may use
    token_pool_rule: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def head_v_dim(self) -> int:
        return self.ssm_inner // self.ssm_n_v_heads

    @property
    def key_dim(self) -> int:
        return self.ssm_n_k_heads * self.ssm_d_state

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.ssm_inner

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0


def _scalar_int(gguf: GgufFile, key: str, default: int | None = None) -> int:
    if key not in gguf.metadata:
        if default is None:
            raise GgufError(f"missing required metadata key {key}")
        return default
    v = gguf.metadata[key]
    if isinstance(v, np.ndarray):  # per-layer array (e.g. head_count_kv): must be uniform
        vals = sorted({int(x) for x in v.tolist() if int(x) != 0})
        if len(vals) != 1:
            raise GgufError(f"{key} = {v.tolist()} is a per-layer array with differing values; not supported")
        return vals[0]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise GgufError(f"{key} = {v!r} is not an integer")
    return int(v)


def _scalar_float(gguf: GgufFile, key: str) -> float:
    if key not in gguf.metadata:
        raise GgufError(f"missing required metadata key {key}")
    v = gguf.metadata[key]
    if isinstance(v, (bool, str, list, np.ndarray)):
        raise GgufError(f"{key} = {v!r} is not a number")
    if gguf.value_types.get(key) == VT_FLOAT32:
        # the shortest decimal that rounds to the same float32 (1e-06, not 9.999999974752427e-07): identical once
        # HF casts it back to float32, and readable in golden.json
        return float(str(np.float32(v)))
    return float(v)


def read_hparams(gguf: GgufFile) -> Hparams:
    arch = gguf.get("general.architecture")
    if arch not in ARCHS:
        raise GgufError(f"general.architecture = {arch!r}; supported: {', '.join(ARCHS)}")
    p = arch + "."
    notes: list[str] = []
    n_block = _scalar_int(gguf, p + "block_count")
    n_nextn = _scalar_int(gguf, p + "nextn_predict_layers", 0)
    n_layer = n_block - n_nextn
    if n_layer <= 0:
        raise GgufError(f"{p}block_count {n_block} minus nextn_predict_layers {n_nextn} leaves no main layer")
    if "token_embd.weight" not in gguf.tensors:
        raise GgufError("missing tensor token_embd.weight")
    embd = gguf.tensors["token_embd.weight"]
    n_embd = _scalar_int(gguf, p + "embedding_length")
    if len(embd.ne) != 2 or embd.ne[0] != n_embd:
        raise GgufError(f"token_embd.weight has ne {list(embd.ne)}, expected [{n_embd}, n_vocab]")
    n_vocab = embd.ne[1]
    pool, pool_rule = token_pool(gguf, n_vocab)
    key_length = _scalar_int(gguf, p + "attention.key_length")
    value_length = _scalar_int(gguf, p + "attention.value_length", key_length)
    if key_length != value_length:
        raise GgufError(f"{p}attention.key_length {key_length} != value_length {value_length}")
    sections: list[int] = []
    if p + "rope.dimension_sections" in gguf.metadata:
        sections = [int(x) for x in np.asarray(gguf.metadata[p + "rope.dimension_sections"]).tolist()]
    elif arch != "qwen3next":
        raise GgufError(f"missing required metadata key {p}rope.dimension_sections (qwen35/qwen35moe)")
    n_expert = _scalar_int(gguf, p + "expert_count", 0)
    if arch in ("qwen35moe", "qwen3next") and n_expert == 0:
        raise GgufError(f"{arch} needs {p}expert_count > 0")
    if arch == "qwen35" and n_expert:
        raise GgufError(f"qwen35 is the dense family but {p}expert_count = {n_expert}")
    n_ff_shared = _scalar_int(gguf, p + "expert_shared_feed_forward_length", 0) if n_expert else 0
    if n_expert and n_ff_shared == 0:
        raise GgufError(f"{p}expert_shared_feed_forward_length is missing or 0: the transformers MoE blocks of "
                        f"{arch} always have a gated shared expert, so this file has no HF equivalent")
    # layer kinds: attention.recurrent_layers (per-layer bools) wins over full_attention_interval (default 4)
    if p + "attention.recurrent_layers" in gguf.metadata:
        rec = [bool(x) for x in np.asarray(gguf.metadata[p + "attention.recurrent_layers"]).tolist()]
        if len(rec) not in (n_layer, n_block):
            raise GgufError(f"{p}attention.recurrent_layers has {len(rec)} entries for {n_layer} layers")
        layer_types = ["linear_attention" if r else "full_attention" for r in rec[:n_layer]]
    else:
        interval = _scalar_int(gguf, p + "full_attention_interval", 4)
        if interval <= 0:
            raise GgufError(f"{p}full_attention_interval must be positive")
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layer)]
    hp = Hparams(
        arch=arch, n_layer=n_layer, n_block=n_block, n_nextn=n_nextn, n_embd=n_embd, n_vocab=n_vocab,
        n_vocab_real=len(pool), n_ctx_train=_scalar_int(gguf, p + "context_length"),
        n_head=_scalar_int(gguf, p + "attention.head_count"),
        n_head_kv=_scalar_int(gguf, p + "attention.head_count_kv"), head_dim=key_length,
        n_rot=_scalar_int(gguf, p + "rope.dimension_count"), rope_theta=_scalar_float(gguf, p + "rope.freq_base"),
        rope_sections=sections, rms_eps=_scalar_float(gguf, p + "attention.layer_norm_rms_epsilon"),
        ssm_conv_kernel=_scalar_int(gguf, p + "ssm.conv_kernel"), ssm_d_state=_scalar_int(gguf, p + "ssm.state_size"),
        ssm_n_k_heads=_scalar_int(gguf, p + "ssm.group_count"),
        ssm_n_v_heads=_scalar_int(gguf, p + "ssm.time_step_rank"), ssm_inner=_scalar_int(gguf, p + "ssm.inner_size"),
        n_expert=n_expert, n_expert_used=_scalar_int(gguf, p + "expert_used_count", 0),
        n_ff_expert=_scalar_int(gguf, p + "expert_feed_forward_length", 0), n_ff_shared=n_ff_shared,
        n_ff_dense=_scalar_int(gguf, p + "feed_forward_length", 0), layer_types=layer_types,
        tied_output="output.weight" not in gguf.tensors,
        gdn_legacy_ssm_in=any(n.endswith(".ssm_in.weight") for n in gguf.tensors), token_pool=pool,
        token_pool_rule=pool_rule, notes=notes)
    _check_hparams(hp)
    return hp


TOKEN_TYPE_NORMAL = 1  # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte


def token_pool(gguf: GgufFile, n_vocab: int) -> tuple[list[int], str]:
    """The ids a golden sequence may use: ordinary tokens only, so padding rows ("[PAD151700]", type unused) and
    control tokens of a padded vocabulary are never fed. Returns (ascending ids, rule used)."""
    types = gguf.get("tokenizer.ggml.token_type")
    tokens = gguf.get("tokenizer.ggml.tokens")
    if isinstance(types, np.ndarray) and types.size:
        ids = [i for i in np.flatnonzero(types[:n_vocab] == TOKEN_TYPE_NORMAL).tolist()]
        if ids:
            return ids, f"ids below {n_vocab} whose tokenizer.ggml.token_type is 1 (normal)"
    if isinstance(tokens, list) and tokens:
        ids = [i for i, t in enumerate(tokens[:n_vocab]) if not (isinstance(t, str) and t.startswith("[PAD"))]
        if ids:
            return ids, f"ids below min({len(tokens)}, {n_vocab}) whose token is not a [PAD...] filler"
    return list(range(n_vocab)), f"every row of token_embd (0 .. {n_vocab - 1}); the file has no tokenizer"


def _check_hparams(hp: Hparams) -> None:
    if hp.n_head % hp.n_head_kv:
        raise GgufError(f"head_count {hp.n_head} is not a multiple of head_count_kv {hp.n_head_kv}")
    if hp.n_rot <= 0 or hp.n_rot > hp.head_dim or hp.n_rot % 2:
        raise GgufError(f"rope.dimension_count {hp.n_rot} must be even and in (0, key_length={hp.head_dim}]")
    if hp.ssm_inner % hp.ssm_n_v_heads:
        raise GgufError(f"ssm.inner_size {hp.ssm_inner} is not a multiple of ssm.time_step_rank {hp.ssm_n_v_heads}")
    if hp.ssm_n_v_heads % hp.ssm_n_k_heads:
        raise GgufError(f"ssm.time_step_rank {hp.ssm_n_v_heads} is not a multiple of ssm.group_count "
                        f"{hp.ssm_n_k_heads}")
    if hp.gdn_legacy_ssm_in and hp.arch != "qwen3next":
        raise GgufError("ssm_in.weight (legacy fused GDN input) only exists in qwen3next files")
    if hp.is_moe and (hp.n_expert_used <= 0 or hp.n_expert_used > hp.n_expert or hp.n_ff_expert <= 0):
        raise GgufError(f"bad MoE shape: expert_count {hp.n_expert}, expert_used_count {hp.n_expert_used}, "
                        f"expert_feed_forward_length {hp.n_ff_expert}")
    if not hp.is_moe and hp.n_ff_dense <= 0:
        raise GgufError("qwen35 (dense) needs feed_forward_length > 0")


# ------------------------------------------------------------------------------------------------ config
def rope_parameters(hp: Hparams) -> dict[str, Any]:
    """transformers 5.x `rope_parameters` (the 4.x name was rope_scaling + rope_theta + partial_rotary_factor)."""
    rp: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(hp.rope_theta),
        "partial_rotary_factor": hp.n_rot / hp.head_dim,
    }
    if hp.arch != "qwen3next":
        # interleaved MRoPE; for text every axis carries the same position, so it equals 1-D NeoX RoPE
        rp["mrope_section"] = [int(s) for s in hp.rope_sections[:3]]
        rp["mrope_interleaved"] = True
    return rp


def hf_config_kwargs(hp: Hparams) -> dict[str, Any]:
    """Keyword arguments for the transformers text config of `hp.arch` (plain Python types only: the 5.x configs
    are strict dataclasses that type-check their fields)."""
    kw: dict[str, Any] = {
        "vocab_size": int(hp.n_vocab),
        "hidden_size": int(hp.n_embd),
        "num_hidden_layers": int(hp.n_layer),
        "num_attention_heads": int(hp.n_head),
        "num_key_value_heads": int(hp.n_head_kv),
        "head_dim": int(hp.head_dim),
        "hidden_act": "silu",
        "max_position_embeddings": int(hp.n_ctx_train),
        "rms_norm_eps": float(hp.rms_eps),
        "tie_word_embeddings": bool(hp.tied_output),
        "rope_parameters": rope_parameters(hp),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": int(hp.ssm_conv_kernel),
        "linear_key_head_dim": int(hp.ssm_d_state),
        "linear_value_head_dim": int(hp.head_v_dim),
        "linear_num_key_heads": int(hp.ssm_n_k_heads),
        "linear_num_value_heads": int(hp.ssm_n_v_heads),
        "layer_types": list(hp.layer_types),
        "use_cache": True,
    }
    if hp.arch == "qwen35":
        kw["intermediate_size"] = int(hp.n_ff_dense)
    else:
        kw.update({
            "num_experts": int(hp.n_expert),
            "num_experts_per_tok": int(hp.n_expert_used),
            "moe_intermediate_size": int(hp.n_ff_expert),
            "shared_expert_intermediate_size": int(hp.n_ff_shared),
        })
    if hp.arch == "qwen3next":
        kw.update({
            "norm_topk_prob": True,  # llama.cpp hard-codes the normalisation for these archs
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "intermediate_size": int(hp.n_ff_dense) if hp.n_ff_dense > 0 else int(hp.n_ff_expert),
        })
    return kw


# ------------------------------------------------------------------------------------------ V-head order
def tiled_to_grouped_index(n_k_heads: int, n_v_heads: int) -> np.ndarray:
    """inv[h] = the GGUF (tiled) position of HF (grouped) V-head h: h = g*r + s  ->  s*Kh + g.
    So hf = gguf[inv] along the head axis undoes the qwen35* converter permutation (model-spec §6.3.4)."""
    r = n_v_heads // n_k_heads
    h = np.arange(n_v_heads)
    return (h % r) * n_k_heads + h // r


def _regroup_heads(x: np.ndarray, inv: np.ndarray, axis: int, head_size: int) -> np.ndarray:
    """Reorder `x` along `axis`, which holds len(inv) consecutive blocks of `head_size` entries."""
    n = len(inv)
    if x.shape[axis] != n * head_size:
        raise GgufError(f"V-head reorder: axis {axis} has {x.shape[axis]} entries, expected {n} x {head_size}")
    shape = x.shape[:axis] + (n, head_size) + x.shape[axis + 1:]
    y = np.take(x.reshape(shape), inv, axis=axis)
    return np.ascontiguousarray(y.reshape(x.shape))


# ------------------------------------------------------------------------------------------- state dict
class _Reader:
    """Reads GGUF tensors as float32 PyTorch-layout arrays, checking shapes and recording what was used."""

    def __init__(self, gguf: GgufFile) -> None:
        self.gguf = gguf
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.gguf.tensors:
            raise GgufError(f"missing tensor {name}")
        a = self.gguf.tensor_f32(name)
        # trailing size-1 ggml dims (e.g. ffn_gate_inp_shexp {H, 1}) are equal to their absence
        if a.shape != shape and int(np.prod(a.shape)) == int(np.prod(shape)):
            squeezed = tuple(d for d in a.shape if d != 1)
            if squeezed == tuple(d for d in shape if d != 1):
                a = a.reshape(shape)
        if a.shape != shape:
            raise GgufError(f"tensor {name}: shape {list(a.shape)} (PyTorch order), expected {list(shape)}")
        self.used.add(name)
        return a


def _minus_one(a: np.ndarray) -> np.ndarray:
    return (a - np.float32(1.0)).astype(np.float32)


def hf_state_dict(gguf: GgufFile, hp: Hparams) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """All HF parameters (float32, PyTorch layout) and a report {used, skipped_mtp, unused, norm_roundtrip_inexact}.
    Raises GgufError if a GGUF tensor outside the MTP blocks was not consumed."""
    rd = _Reader(gguf)
    H, V = hp.n_embd, hp.n_vocab
    sd: dict[str, np.ndarray] = {}
    norm_inexact = 0

    def norm(name: str, size: int) -> np.ndarray:
        nonlocal norm_inexact
        stored = rd.get(name, (size,))
        w = _minus_one(stored)
        # HF computes (1.0 + w) in float32; that gives back `stored` exactly when stored is in [0.5, 2] (Sterbenz)
        norm_inexact += int(np.count_nonzero((np.float32(1.0) + w) != stored))
        return w

    sd["model.embed_tokens.weight"] = rd.get("token_embd.weight", (V, H))
    sd["model.norm.weight"] = norm("output_norm.weight", H)
    sd["lm_head.weight"] = rd.get("output.weight", (V, H)) if not hp.tied_output else sd["model.embed_tokens.weight"]

    Kh, Vh, dk, dv = hp.ssm_n_k_heads, hp.ssm_n_v_heads, hp.ssm_d_state, hp.head_v_dim
    r = Vh // Kh
    key_dim, value_dim, C, K = hp.key_dim, hp.ssm_inner, hp.conv_dim, hp.ssm_conv_kernel
    inv = tiled_to_grouped_index(Kh, Vh)
    tiled = hp.arch != "qwen3next"
    hd, nh, nkv = hp.head_dim, hp.n_head, hp.n_head_kv

    for i in range(hp.n_layer):
        b, m = f"blk.{i}.", f"model.layers.{i}."
        sd[m + "input_layernorm.weight"] = norm(b + "attn_norm.weight", H)
        sd[m + "post_attention_layernorm.weight"] = norm(b + "post_attention_norm.weight", H)
        if hp.layer_types[i] == "full_attention":
            a = m + "self_attn."
            sd[a + "q_proj.weight"] = rd.get(b + "attn_q.weight", (nh * 2 * hd, H))
            sd[a + "k_proj.weight"] = rd.get(b + "attn_k.weight", (nkv * hd, H))
            sd[a + "v_proj.weight"] = rd.get(b + "attn_v.weight", (nkv * hd, H))
            sd[a + "o_proj.weight"] = rd.get(b + "attn_output.weight", (H, nh * hd))
            sd[a + "q_norm.weight"] = norm(b + "attn_q_norm.weight", hd)
            sd[a + "k_norm.weight"] = norm(b + "attn_k_norm.weight", hd)
        else:
            g = m + "linear_attn."
            ssm_a = rd.get(b + "ssm_a", (Vh,))
            if np.any(ssm_a >= 0):
                raise GgufError(f"{b}ssm_a has non-negative entries; it must be -exp(A_log) < 0")
            a_log = np.log(-ssm_a.astype(np.float64)).astype(np.float32)
            dt_bias = rd.get(b + "ssm_dt.bias", (Vh,))
            conv = rd.get(b + "ssm_conv1d.weight", (C, K))
            out = rd.get(b + "ssm_out.weight", (H, value_dim))
            if tiled:
                qkv = rd.get(b + "attn_qkv.weight", (2 * key_dim + value_dim, H))
                qkv = np.concatenate([qkv[:2 * key_dim], _regroup_heads(qkv[2 * key_dim:], inv, 0, dv)], axis=0)
                conv = np.concatenate([conv[:2 * key_dim], _regroup_heads(conv[2 * key_dim:], inv, 0, dv)], axis=0)
                sd[g + "in_proj_qkv.weight"] = qkv
                sd[g + "in_proj_z.weight"] = _regroup_heads(rd.get(b + "attn_gate.weight", (value_dim, H)), inv, 0, dv)
                sd[g + "in_proj_b.weight"] = _regroup_heads(rd.get(b + "ssm_beta.weight", (Vh, H)), inv, 0, 1)
                sd[g + "in_proj_a.weight"] = _regroup_heads(rd.get(b + "ssm_alpha.weight", (Vh, H)), inv, 0, 1)
                a_log = _regroup_heads(a_log, inv, 0, 1)
                dt_bias = _regroup_heads(dt_bias, inv, 0, 1)
                out = _regroup_heads(out, inv, 1, dv)
            elif hp.gdn_legacy_ssm_in:
                sd[g + "in_proj_qkvz.weight"] = rd.get(b + "ssm_in.weight", (2 * key_dim + 2 * value_dim, H))
                sd[g + "in_proj_ba.weight"] = rd.get(b + "ssm_ba.weight", (2 * Vh, H))
            else:
                qkv = rd.get(b + "attn_qkv.weight", (2 * key_dim + value_dim, H))
                z = rd.get(b + "attn_gate.weight", (value_dim, H))
                q, k, v = qkv[:key_dim], qkv[key_dim:2 * key_dim], qkv[2 * key_dim:]
                groups = []
                for grp in range(Kh):
                    groups += [q[grp * dk:(grp + 1) * dk], k[grp * dk:(grp + 1) * dk],
                               v[grp * r * dv:(grp + 1) * r * dv], z[grp * r * dv:(grp + 1) * r * dv]]
                sd[g + "in_proj_qkvz.weight"] = np.ascontiguousarray(np.concatenate(groups, axis=0))
                sd[g + "in_proj_ba.weight"] = rd.get(b + "ssm_ba.weight", (2 * Vh, H))
            sd[g + "conv1d.weight"] = np.ascontiguousarray(conv.reshape(C, 1, K))
            sd[g + "dt_bias"] = dt_bias
            sd[g + "A_log"] = a_log
            sd[g + "norm.weight"] = rd.get(b + "ssm_norm.weight", (dv,))  # NOT zero-centred: no -1
            sd[g + "out_proj.weight"] = out
        f = m + "mlp."
        if hp.is_moe:
            E, I, Is = hp.n_expert, hp.n_ff_expert, hp.n_ff_shared
            sd[f + "gate.weight"] = rd.get(b + "ffn_gate_inp.weight", (E, H))
            if rd.has(b + "ffn_gate_up_exps.weight"):  # merged form, rows [gate | up] per expert
                sd[f + "experts.gate_up_proj"] = rd.get(b + "ffn_gate_up_exps.weight", (E, 2 * I, H))
            else:
                gate = rd.get(b + "ffn_gate_exps.weight", (E, I, H))
                up = rd.get(b + "ffn_up_exps.weight", (E, I, H))
                sd[f + "experts.gate_up_proj"] = np.ascontiguousarray(np.concatenate([gate, up], axis=1))
            sd[f + "experts.down_proj"] = rd.get(b + "ffn_down_exps.weight", (E, H, I))
            sd[f + "shared_expert.gate_proj.weight"] = rd.get(b + "ffn_gate_shexp.weight", (Is, H))
            sd[f + "shared_expert.up_proj.weight"] = rd.get(b + "ffn_up_shexp.weight", (Is, H))
            sd[f + "shared_expert.down_proj.weight"] = rd.get(b + "ffn_down_shexp.weight", (H, Is))
            sd[f + "shared_expert_gate.weight"] = rd.get(b + "ffn_gate_inp_shexp.weight", (1, H))
        else:
            I = hp.n_ff_dense
            sd[f + "gate_proj.weight"] = rd.get(b + "ffn_gate.weight", (I, H))
            sd[f + "up_proj.weight"] = rd.get(b + "ffn_up.weight", (I, H))
            sd[f + "down_proj.weight"] = rd.get(b + "ffn_down.weight", (H, I))

    mtp_prefixes = tuple(f"blk.{i}." for i in range(hp.n_layer, hp.n_block))
    skipped = sorted(n for n in gguf.tensors if n not in rd.used and mtp_prefixes and n.startswith(mtp_prefixes))
    unused = sorted(n for n in gguf.tensors if n not in rd.used and n not in skipped)
    if unused:
        raise GgufError(f"{len(unused)} GGUF tensor(s) have no place in the HF model (not converted, not MTP): "
                        f"{', '.join(unused[:12])}{' ...' if len(unused) > 12 else ''}")
    report = {"used": sorted(rd.used), "skipped_mtp": skipped, "norm_roundtrip_inexact": norm_inexact}
    return sd, report


def expert_state_dict_to_per_expert(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Older transformers (4.x) kept one module per expert: experts.{e}.{gate,up,down}_proj.weight. Splits the
    fused 5.x arrays into that form (used only when the installed model asks for those names)."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            i_half = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = np.ascontiguousarray(v[e, :i_half])
                out[f"{pre}{e}.up_proj.weight"] = np.ascontiguousarray(v[e, i_half:])
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = np.ascontiguousarray(v[e])
        else:
            out[k] = v
    return out
