#!/usr/bin/env python3
"""Kestrel golden-fixture generator: runs Hugging Face transformers on a small GGUF model and writes the numbers the
C++ reference forward is tested against (format: tests/golden/README.md).

For each GGUF file (qwen35moe / qwen35 / qwen3next, llama.cpp layout as written by kestrel-mkmodel):
  1. read it with the numpy GGUF reader (gguf_read.py), build the matching transformers 5.x text config and undo
     llama.cpp's converter transforms to get HF-layout float32 weights (gguf_to_hf.py);
  2. build Qwen3_5MoeForCausalLM / Qwen3_5ForCausalLM / Qwen3NextForCausalLM in float32 on the CPU with eager
     attention, eager experts and the PyTorch reference Gated-DeltaNet kernels (flash-linear-attention and
     causal-conv1d are bypassed even if installed), load the weights with load_state_dict(strict=True);
  3. run a fixed token sequence (N >= 80, default 96, ids from splitmix64(seed) modulo the real vocabulary)
     (a) as one prefill forward and (b) token by token with the model's own cache, capturing the residual stream
     after every decoder layer (forward hooks) and the logits at every position;
  4. check prefill against decode and write tests/golden/fixtures/<name>/{golden.json, golden.bin}.

Usage (on a machine with torch and transformers; the lead runs it on a lent GPU host, CPU is used):
  python3 tools/golden/make_golden.py MODEL.gguf [MODEL2.gguf ...] [--out tests/golden/fixtures] [--n-tokens 96]
  python3 tools/golden/make_golden.py --convert-only MODEL.gguf     # numpy only: parse + convert + summary
  python3 tools/golden/make_golden.py --self-test                   # numpy only: reader/dequant/transform tests
Exit status: 0 ok, 1 error (bad file, HF mismatch), 2 prefill/decode disagreement above --max-rel-diff.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import sys
import time
from typing import Any, Callable

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np  # noqa: E402
except ImportError:  # pragma: no cover - environment problem, not a code path
    sys.exit("error: numpy is required (Debian: apt-get install python3-numpy, then run with /usr/bin/python3 if "
             "another python3 comes first on PATH)")

from gguf_read import GGML_TYPES, GgufError, GgufFile  # noqa: E402
from gguf_to_hf import (Hparams, expert_state_dict_to_per_expert, hf_config_kwargs, hf_state_dict,  # noqa: E402
                        read_hparams)

FORMAT_NAME = "kestrel-golden"
FORMAT_VERSION = 1
TOPK = 16
LAST_K_LOGITS = 8

# arch -> (modeling module, model class, configuration module, config class); verified against transformers
# src/transformers/models/{qwen3_5_moe,qwen3_5,qwen3_next}/{modeling,configuration}_*.py (5.x).
HF_CLASSES = {
    "qwen35moe": ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeForCausalLM",
                  "transformers.models.qwen3_5_moe.configuration_qwen3_5_moe", "Qwen3_5MoeTextConfig"),
    "qwen35": ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5ForCausalLM",
               "transformers.models.qwen3_5.configuration_qwen3_5", "Qwen3_5TextConfig"),
    "qwen3next": ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextForCausalLM",
                  "transformers.models.qwen3_next.configuration_qwen3_next", "Qwen3NextConfig"),
}
# Every modeling module whose GDN code may run for these archs (qwen3_5_moe's GDN subclasses qwen3_5's).
GDN_MODULES = ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "transformers.models.qwen3_5.modeling_qwen3_5",
               "transformers.models.qwen3_next.modeling_qwen3_next")
# Module-level names through which the GDN forward reaches its kernels. 5.x: `torch_*` and `causal_conv1d_*` are
# reference functions wrapped by use_kernel_func_from_hub_with_fallback, which binds flash-linear-attention /
# causal-conv1d at import time when installed. Older files imported the packages under the plain names.
GDN_FUNCTION_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                      "causal_conv1d_update", "torch_causal_conv1d_update", "chunk_gated_delta_rule",
                      "fused_recurrent_gated_delta_rule")
GDN_FAST_CLASSES = ("FusedRMSNormGated",)

MASK64 = (1 << 64) - 1


def splitmix64(seed: int, count: int) -> list[int]:
    """`count` outputs of splitmix64 started at state `seed` (state += golden gamma, then the mix)."""
    out, x = [], seed & MASK64
    for _ in range(count):
        x = (x + 0x9E3779B97F4A7C15) & MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out.append(z ^ (z >> 31))
    return out


def token_ids(n: int, pool: list[int], seed: int) -> list[int]:
    """id[t] = pool[splitmix64 output t modulo len(pool)] (pool: ascending allowed ids)."""
    return [int(pool[v % len(pool)]) for v in splitmix64(seed, n)]


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------- HF side
def _closure_value(fn: Any, name: str) -> Any:
    seen = 0
    while fn is not None and seen < 8:
        code = getattr(fn, "__code__", None)
        if code is not None and fn.__closure__ and name in code.co_freevars:
            return fn.__closure__[code.co_freevars.index(name)].cell_contents
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return None


def force_torch_gdn(mod: Any, calls: dict[str, int]) -> dict[str, str]:
    """Rebind the GDN kernel names of modeling module `mod` to the PyTorch reference implementations (wrapped to
    count calls into `calls`). Must run before the model is built (older files pick kernels in __init__)."""
    report: dict[str, str] = {}
    old_style = hasattr(mod, "is_fast_path_available") or hasattr(mod, "FusedRMSNormGated")
    for name in GDN_FUNCTION_NAMES:
        if not hasattr(mod, name):
            continue
        obj = getattr(mod, name)
        if obj is None:
            report[name] = "None (package not installed): torch fallback"
            continue
        if getattr(obj, "_kestrel_counting", False):
            # Rebound by an earlier model of this run: wrap the same reference function again so the calls are
            # counted into this model's `calls` (the old wrapper counts into the previous model's dict).
            base = obj._kestrel_base
            setattr(mod, name, _counting(base, name, calls))
            report[name] = f"{base.__module__}.{base.__name__} (PyTorch reference)"
            continue
        base = inspect.unwrap(obj)
        bound_fast = _closure_value(obj, "is_new_implementation")
        if str(getattr(base, "__module__", "")).startswith("transformers."):  # HF's own PyTorch code
            setattr(mod, name, _counting(base, name, calls))
            extra = "; an optimised package had been bound and is bypassed" if bound_fast else ""
            report[name] = f"{base.__module__}.{base.__name__} (PyTorch reference{extra})"
        elif old_style and not name.startswith("torch_"):
            setattr(mod, name, None)
            report[name] = f"{getattr(base, '__module__', '?')}.{getattr(base, '__name__', '?')} -> None (torch " \
                           f"fallback)"
        else:
            raise RuntimeError(f"{mod.__name__}.{name} does not lead to a PyTorch reference function "
                               f"(found {base!r}); cannot guarantee the reference GDN path")
    for cname in GDN_FAST_CLASSES:
        if getattr(mod, cname, None) is not None:
            setattr(mod, cname, None)
            report[cname] = "-> None (torch RMSNormGated)"
    if getattr(mod, "is_fast_path_available", False):
        mod.is_fast_path_available = False
    return report


def _counting(fn: Callable, name: str, calls: dict[str, int]) -> Callable:
    params = inspect.signature(fn).parameters
    takes_var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        if not takes_var_kw:
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        return fn(*args, **kwargs)

    wrapper._kestrel_counting = True  # type: ignore[attr-defined]
    wrapper._kestrel_base = fn  # type: ignore[attr-defined]
    wrapper.__name__ = fn.__name__
    return wrapper


def _config_fields(cfg_cls: Any) -> set[str] | None:
    import dataclasses
    if dataclasses.is_dataclass(cfg_cls):
        return {f.name for f in dataclasses.fields(cfg_cls)}
    params = inspect.signature(cfg_cls.__init__).parameters
    return {k for k in params if k not in ("self", "kwargs")}


def build_config(cfg_cls: Any, kw: dict[str, Any], notes: list[str]) -> Any:
    fields = _config_fields(cfg_cls)
    kw = dict(kw)
    if fields is not None and "rope_parameters" not in fields:
        rp = kw.pop("rope_parameters")  # transformers 4.x spelling
        kw["rope_theta"] = rp["rope_theta"]
        kw["partial_rotary_factor"] = rp["partial_rotary_factor"]
        if "mrope_section" in rp:
            kw["rope_scaling"] = {"rope_type": "default", "mrope_section": rp["mrope_section"],
                                  "mrope_interleaved": True}
        notes.append("config has no rope_parameters field (transformers 4.x): used rope_theta/partial_rotary_factor"
                     "/rope_scaling")
    if fields is not None:
        unknown = [k for k in kw if k not in fields]
        if unknown:
            notes.append(f"config class {cfg_cls.__name__} has no field(s) {unknown}; passed as extra kwargs")
    cfg = cfg_cls(**kw)
    for k, v in kw.items():
        got = getattr(cfg, k, None)
        if k == "rope_parameters":
            if not isinstance(got, dict) or any(got.get(rk) != rv for rk, rv in v.items()):
                raise RuntimeError(f"config.rope_parameters = {got!r}, expected to contain {v!r}")
        elif k in ("rope_theta", "partial_rotary_factor", "rope_scaling"):
            continue
        elif got != v:
            raise RuntimeError(f"config.{k} = {got!r} after construction, expected {v!r}")
    cfg._attn_implementation = "eager"
    try:
        cfg._experts_implementation = "eager"
    except Exception as exc:  # noqa: BLE001 - older configs have no such property
        notes.append(f"could not set _experts_implementation on the config ({exc})")
    return cfg


def _set_eager_everywhere(model: Any, notes: list[str]) -> dict[str, Any]:
    """Eager attention and eager (per-expert loop) MoE everywhere; returns what the model's configs report."""
    if getattr(model.config, "_attn_implementation", "eager") != "eager" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    if getattr(model.config, "_attn_implementation", None) != "eager":
        raise RuntimeError(f"attention implementation is {model.config._attn_implementation!r}, could not force "
                           f"'eager'")
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as exc:  # noqa: BLE001 - recorded; the per-config setting below still applies
            notes.append(f"set_experts_implementation('eager') failed: {exc}")
    configs = {id(m.config): m.config for m in model.modules() if getattr(m, "config", None) is not None}
    for c in configs.values():
        if getattr(c, "_experts_implementation", None) not in (None, "eager"):
            c._experts_implementation = "eager"
    attn = {str(getattr(c, "_attn_implementation", None)) for c in configs.values()}
    experts = {str(getattr(c, "_experts_implementation", None)) for c in configs.values()}
    if experts - {"eager", "None"}:
        raise RuntimeError(f"experts implementation is {experts}, could not force 'eager'")
    return {"attn_implementation": sorted(attn), "experts_implementation": sorted(experts)}


def _check_model_structure(torch: Any, model: Any, hp: Hparams) -> None:
    layers = model.model.layers
    if len(layers) != hp.n_layer:
        raise RuntimeError(f"HF model has {len(layers)} layers, GGUF has {hp.n_layer}")
    for i, layer in enumerate(layers):
        is_linear = hasattr(layer, "linear_attn")
        if is_linear != (hp.layer_types[i] == "linear_attention"):
            raise RuntimeError(f"layer {i}: HF built {'GDN' if is_linear else 'attention'}, GGUF says "
                               f"{hp.layer_types[i]}")
    rot = model.model.rotary_emb
    inv = rot.inv_freq.detach().double().cpu().numpy()
    want = 1.0 / (hp.rope_theta ** (np.arange(0, hp.n_rot, 2, dtype=np.float64) / hp.n_rot))
    if inv.shape != want.shape or not np.allclose(inv, want, rtol=1e-5, atol=0):
        raise RuntimeError(f"HF rotary inv_freq {inv[:4]}... (len {inv.size}) != expected theta={hp.rope_theta}, "
                           f"rot dims={hp.n_rot} {want[:4]}... (len {want.size})")
    del torch


def load_weights(torch: Any, model: Any, sd: dict[str, np.ndarray], hp: Hparams) -> None:
    expected = model.state_dict()
    if any(".mlp.experts.0.gate_proj.weight" in k for k in expected):
        sd = expert_state_dict_to_per_expert(sd)
    if "lm_head.weight" not in expected and hp.tied_output:
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    missing = sorted(k for k in expected if k not in sd)
    unexpected = sorted(k for k in sd if k not in expected)
    bad_shape = [f"{k}: HF {list(expected[k].shape)} vs GGUF-derived {list(sd[k].shape)}" for k in expected
                 if k in sd and tuple(expected[k].shape) != tuple(sd[k].shape)]
    if missing or unexpected or bad_shape:
        lines = [f"missing ({len(missing)}): {missing}", f"unexpected ({len(unexpected)}): {unexpected}",
                 f"shape mismatches ({len(bad_shape)}): {bad_shape}"]
        raise RuntimeError("state dict does not match the HF model:\n  " + "\n  ".join(lines))
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}
    result = model.load_state_dict(tensors, strict=True)
    if getattr(result, "missing_keys", None) or getattr(result, "unexpected_keys", None):
        raise RuntimeError(f"load_state_dict: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    if hp.tied_output and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight):
        raise RuntimeError("tied output: lm_head.weight differs from embed_tokens.weight after loading")


def run_hf(gguf_path: str, hp: Hparams, sd: dict[str, np.ndarray], ids: list[int], threads: int) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import importlib

    import torch
    import transformers

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_default_dtype(torch.float32)
    notes: list[str] = []
    mod_name, cls_name, cfg_mod_name, cfg_cls_name = HF_CLASSES[hp.arch]
    calls: dict[str, int] = {}
    kernels: dict[str, dict[str, str]] = {}
    for name in GDN_MODULES:
        try:
            m = importlib.import_module(name)
        except ImportError:
            continue
        kernels[name] = force_torch_gdn(m, calls)
    model_cls = getattr(importlib.import_module(mod_name), cls_name)
    cfg_cls = getattr(importlib.import_module(cfg_mod_name), cfg_cls_name)
    cfg = build_config(cfg_cls, hf_config_kwargs(hp), notes)
    torch.manual_seed(0)
    model = model_cls(cfg)
    model.eval()
    model.to(dtype=torch.float32, device="cpu")
    impl = _set_eager_everywhere(model, notes)
    _check_model_structure(torch, model, hp)
    for m in model.modules():  # no fused FLA norm may survive
        if type(m).__module__.startswith("fla"):
            raise RuntimeError(f"module {type(m).__name__} from {type(m).__module__} in the model; reference path "
                               f"not guaranteed")
    load_weights(torch, model, sd, hp)

    captured: list[Any] = []

    def hook(_module: Any, _args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        captured.append(out.detach().to(torch.float32).clone())

    handles = [layer.register_forward_hook(hook) for layer in model.model.layers]
    L, N = hp.n_layer, len(ids)
    n_gdn = hp.layer_types.count("linear_attention")
    input_ids = torch.tensor([ids], dtype=torch.long)
    positions = torch.arange(N, dtype=torch.long).unsqueeze(0)
    result: dict[str, Any] = {"notes": notes}
    with torch.no_grad():
        # (a) one prefill forward, no cache
        calls.clear()
        captured.clear()
        t0 = time.time()
        out = model(input_ids=input_ids, position_ids=positions, use_cache=False, output_hidden_states=True)
        result["prefill_seconds"] = time.time() - t0
        if len(captured) != L:
            raise RuntimeError(f"prefill captured {len(captured)} layer outputs, expected {L}")
        pre_hidden = torch.stack([c[0] for c in captured]).numpy()  # f32 [L, N, H]
        pre_logits = out.logits[0].to(torch.float32).numpy().copy()  # f32 [N, V]
        result["prefill_gdn_calls"] = dict(calls)
        _check_gdn_calls(calls, n_gdn, "prefill (one forward)")
        result["hidden_states_semantics"] = _hidden_states_semantics(torch, model, input_ids, out, captured)
        # (b) token by token with the model's own cache
        calls.clear()
        dec_hidden = np.zeros_like(pre_hidden)
        dec_logits = np.zeros_like(pre_logits)
        past = None
        cache_class = None
        t0 = time.time()
        for t in range(N):
            captured.clear()
            step = model(input_ids=input_ids[:, t:t + 1], position_ids=positions[:, t:t + 1],
                         past_key_values=past, use_cache=True)
            if step.past_key_values is None:
                raise RuntimeError("decode step returned no past_key_values")
            past = step.past_key_values
            cache_class = f"{type(past).__module__}.{type(past).__name__}"
            if len(captured) != L:
                raise RuntimeError(f"decode step {t} captured {len(captured)} layer outputs, expected {L}")
            for i in range(L):
                dec_hidden[i, t] = captured[i][0, -1].numpy()
            dec_logits[t] = step.logits[0, -1].to(torch.float32).numpy()
        result["decode_seconds"] = time.time() - t0
        result["decode_gdn_calls"] = dict(calls)
        _check_gdn_calls(calls, n_gdn * N, f"decode ({N} steps)")
    for h in handles:
        h.remove()
    result.update({
        "prefill_hidden": pre_hidden, "prefill_logits": pre_logits,
        "decode_hidden": dec_hidden, "decode_logits": dec_logits,
        "cache_class": cache_class, "gdn_kernels": kernels, **impl,
        "model_class": f"{model_cls.__module__}.{model_cls.__name__}",
        "config_class": f"{cfg_cls.__module__}.{cfg_cls.__name__}",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "hf_config": _jsonable(cfg.to_dict()) if hasattr(cfg, "to_dict") else None,
    })
    return result


def _check_gdn_calls(calls: dict[str, int], expected: int, phase: str) -> None:
    """Every GDN layer call must have gone through a counted PyTorch reference delta-rule function."""
    n = calls.get("torch_chunk_gated_delta_rule", 0) + calls.get("torch_recurrent_gated_delta_rule", 0)
    if n != expected:
        raise RuntimeError(f"{phase}: {n} calls of the PyTorch reference gated-delta-rule functions, expected "
                           f"{expected} (one per GDN layer per forward): the GDN path that ran is not the reference "
                           f"one (calls seen: {calls})")


def _hidden_states_semantics(torch: Any, model: Any, input_ids: Any, out: Any, captured: list[Any]) -> dict:
    """Measures what HF's `hidden_states` tuple holds for this class (rather than assuming it)."""
    hs = out.hidden_states
    L = len(captured)
    if hs is None:
        return {"hf_tuple_length": 0, "note": "model returned no hidden_states"}

    def maxdiff(a: Any, b: Any) -> float | None:  # None: shapes differ
        return float((a.to(torch.float32) - b.to(torch.float32)).abs().max()) if a.shape == b.shape else None

    emb = model.model.embed_tokens(input_ids)
    sem: dict[str, Any] = {"hf_tuple_length": len(hs)}
    sem["index0_minus_embeddings_maxabs"] = maxdiff(hs[0], emb)
    inner = [maxdiff(hs[i + 1], captured[i]) for i in range(min(L - 1, len(hs) - 1))]
    sem["index_i_plus_1_minus_layer_i_output_maxabs_for_i_lt_last"] = \
        None if not inner or None in inner else max(inner)
    if len(hs) == L + 1:
        normed = model.model.norm(captured[L - 1])
        sem["last_minus_final_norm_of_last_layer_maxabs"] = maxdiff(hs[L], normed)
        sem["last_minus_last_layer_output_maxabs"] = maxdiff(hs[L], captured[L - 1])
        tol = 1e-6 * max(float(normed.abs().max()), float(captured[L - 1].abs().max()), 1.0)
        post, pre = sem["last_minus_final_norm_of_last_layer_maxabs"], sem["last_minus_last_layer_output_maxabs"]
        if post is not None and post <= tol:
            sem["last_entry"] = "post-final-norm (model.norm(output of the last layer))"
        elif pre is not None and pre <= tol:
            sem["last_entry"] = "pre-final-norm (output of the last layer)"
        else:
            sem["last_entry"] = "neither (see the diffs)"
    sem["summary"] = ("hidden_states[0] = embeddings; hidden_states[i+1] = output of layer i for i < n_layer-1; "
                      "hidden_states[n_layer] is checked above. golden.bin stores the output of every layer i "
                      "(pre-final-norm) taken with forward hooks on model.model.layers[i].")
    return sem


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


# ----------------------------------------------------------------------------------------- fixture writing
def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    return {"max_abs": max_abs, "max_abs_ref": scale, "max_rel": max_abs / scale if scale > 0 else max_abs}


def topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the k largest logits, descending; ties go to the lower token id. Returns (ids i32, values f32)."""
    n, v = logits.shape
    ids = np.empty((n, k), dtype=np.int32)
    vals = np.empty((n, k), dtype=np.float32)
    cols = np.arange(v)
    for i in range(n):
        order = np.lexsort((cols, -logits[i].astype(np.float64)))[:k]
        ids[i] = order
        vals[i] = logits[i, order]
    return ids, vals


def write_fixture(out_dir: str, meta: dict[str, Any], arrays: list[tuple[str, np.ndarray]]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    table, offset = [], 0
    bin_path = os.path.join(out_dir, "golden.bin")
    with open(bin_path + ".tmp", "wb") as f:
        for name, arr in arrays:
            if arr.dtype == np.float32:
                data, dt = arr.astype("<f4", copy=False), "f32"
            elif arr.dtype == np.int32:
                data, dt = arr.astype("<i4", copy=False), "i32"
            else:
                raise ValueError(f"{name}: dtype {arr.dtype} not allowed in golden.bin")
            raw = np.ascontiguousarray(data).tobytes()
            f.write(raw)
            table.append({"name": name, "dtype": dt, "shape": [int(d) for d in arr.shape], "offset": offset,
                          "nbytes": len(raw)})
            offset += len(raw)
    os.replace(bin_path + ".tmp", bin_path)
    meta = _jsonable(meta)
    meta["arrays"] = table
    meta["bin_bytes"] = offset
    meta["bin_sha256"] = sha256_file(bin_path)
    json_path = os.path.join(out_dir, "golden.json")
    with open(json_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=False, allow_nan=False)
        f.write("\n")
    os.replace(json_path + ".tmp", json_path)


def convert(path: str) -> tuple[Hparams, dict[str, np.ndarray], dict[str, Any], dict[str, int]]:
    """GGUF -> (hparams, HF state dict, conversion report incl. provenance keys, tensor type counts)."""
    with GgufFile(path) as g:
        hp = read_hparams(g)
        sd, report = hf_state_dict(g, hp)
        types: dict[str, int] = {}
        for t in g.tensors.values():
            types[GGML_TYPES[t.ggml_type][0]] = types.get(GGML_TYPES[t.ggml_type][0], 0) + 1
        # how the file was made (kestrel-mkmodel writes kestrel.mkmodel.{preset,seed,types})
        report["provenance"] = {k: _jsonable(v) for k, v in g.metadata.items()
                                if k.startswith(("kestrel.", "general.")) and isinstance(v, (str, int, float))}
        report["provenance"]["gdn_layout"] = "legacy (ssm_in)" if hp.gdn_legacy_ssm_in else "split"
    return hp, sd, report, types


def generate(path: str, args: argparse.Namespace) -> dict[str, Any]:
    hp, sd, report, types = convert(path)
    n = args.n_tokens
    ids = token_ids(n, hp.token_pool, args.seed)
    name = args.name if args.name else os.path.splitext(os.path.basename(path))[0]
    print(f"[{name}] {hp.arch}: {hp.n_layer} layers ({hp.layer_types.count('linear_attention')} GDN), H={hp.n_embd}, "
          f"V={hp.n_vocab}, tensor types {types}; running transformers on {n} tokens ...", flush=True)
    res = run_hf(path, hp, sd, ids, args.threads)
    L, H, V = hp.n_layer, hp.n_embd, hp.n_vocab
    agree = {
        "hidden_per_layer": [agreement(res["prefill_hidden"][i], res["decode_hidden"][i]) for i in range(L)],
        "logits": agreement(res["prefill_logits"], res["decode_logits"]),
    }
    agree["hidden_max_rel"] = max(a["max_rel"] for a in agree["hidden_per_layer"])
    full_logits = n * V * 4 <= args.full_logits_max_bytes
    arrays: list[tuple[str, np.ndarray]] = [("prefill_hidden", res["prefill_hidden"])]
    if full_logits:
        arrays += [("prefill_logits", res["prefill_logits"]), ("decode_hidden", res["decode_hidden"]),
                   ("decode_logits", res["decode_logits"])]
        logits_doc = {"mode": "full", "positions": list(range(n))}
    else:
        k = min(args.last_logits, n)
        pids, pvals = topk(res["prefill_logits"], min(TOPK, V))
        dids, dvals = topk(res["decode_logits"], min(TOPK, V))
        arrays += [("prefill_logits", res["prefill_logits"][n - k:]), ("decode_hidden", res["decode_hidden"]),
                   ("decode_logits", res["decode_logits"][n - k:]), ("prefill_topk_ids", pids),
                   ("prefill_topk_logits", pvals), ("decode_topk_ids", dids), ("decode_topk_logits", dvals)]
        logits_doc = {"mode": "last_k_plus_topk", "positions": list(range(n - k, n)), "topk": min(TOPK, V),
                      "topk_order": "descending logit, ties to the lower token id"}
    meta = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "name": name, "arch": hp.arch,
        "gguf": {"file": os.path.basename(path), "sha256": sha256_file(path), "bytes": os.path.getsize(path),
                 "tensor_types": types, "provenance": report["provenance"]},
        "n_tokens": n, "token_ids": ids,
        "token_generator": {"seed": args.seed, "pool_size": len(hp.token_pool), "pool_rule": hp.token_pool_rule,
                            "rule": "id[t] = pool[s_t mod pool_size], s_t = splitmix64 output t (state starts at "
                                    "seed; state += 0x9E3779B97F4A7C15, then z^=z>>30, z*=0xBF58476D1CE4E5B9, "
                                    "z^=z>>27, z*=0x94D049BB133111EB, z^=z>>31); pool = ascending allowed ids"},
        "positions": "0 .. n_tokens-1 (position_ids passed explicitly)",
        "n_layer": L, "n_embd": H, "n_vocab": V, "layer_types": hp.layer_types,
        "hparams": {k: v for k, v in vars(hp).items() if k not in ("notes", "token_pool")},
        "dtype": "float32", "device": "cpu",
        "producer": {
            "script": "tools/golden/make_golden.py", "argv": sys.argv[1:],
            "model_class": res["model_class"], "config_class": res["config_class"],
            "transformers": res["transformers_version"], "torch": res["torch_version"], "numpy": np.__version__,
            "python": platform.python_version(), "torch_threads": res["torch_threads"],
            "deterministic_algorithms": res["deterministic_algorithms"],
            "attn_implementation": res["attn_implementation"],
            "experts_implementation": res["experts_implementation"], "cache_class": res["cache_class"],
            "gdn_kernels": res["gdn_kernels"], "gdn_calls_prefill": res["prefill_gdn_calls"],
            "gdn_calls_decode": res["decode_gdn_calls"],
            "seconds": {"prefill": res["prefill_seconds"], "decode": res["decode_seconds"]},
            "origin": "numbers computed by Hugging Face transformers (third-party code), not by Kestrel",
        },
        "hf_config": res["hf_config"],
        "hidden_states_semantics": res["hidden_states_semantics"],
        "logits": logits_doc,
        "agreement_prefill_vs_decode": agree,
        "conversion": {"norm_roundtrip_inexact": report["norm_roundtrip_inexact"],
                       "skipped_mtp_tensors": report["skipped_mtp"], "tensors_used": len(report["used"])},
        "notes": hp.notes + res["notes"],
    }
    ok = agree["hidden_max_rel"] <= args.max_rel_diff and agree["logits"]["max_rel"] <= args.max_rel_diff
    print(f"[{name}] prefill vs decode: hidden max rel {agree['hidden_max_rel']:.3e}, logits max abs "
          f"{agree['logits']['max_abs']:.3e} (rel {agree['logits']['max_rel']:.3e}); GDN calls prefill "
          f"{res['prefill_gdn_calls']} decode {res['decode_gdn_calls']}", flush=True)
    if not ok:
        raise DisagreementError(f"[{name}] prefill and decode disagree beyond --max-rel-diff {args.max_rel_diff}; "
                                f"no fixture written")
    out_dir = os.path.join(args.out, name)
    write_fixture(out_dir, meta, arrays)
    print(f"[{name}] wrote {out_dir}/golden.json and golden.bin", flush=True)
    return {"name": name, "arch": hp.arch, "hidden_max_rel": agree["hidden_max_rel"],
            "logits_max_abs": agree["logits"]["max_abs"], "logits_max_rel": agree["logits"]["max_rel"]}


class DisagreementError(RuntimeError):
    pass


def convert_only(path: str) -> None:
    hp, sd, report, types = convert(path)
    print(f"{path}: arch {hp.arch}, {hp.n_layer} main layers (+{hp.n_nextn} MTP), H={hp.n_embd}, V={hp.n_vocab} "
          f"(real {hp.n_vocab_real}), tied output {hp.tied_output}, legacy ssm_in {hp.gdn_legacy_ssm_in}")
    print(f"  tensor types: {types}; {len(report['used'])} tensors converted, {len(report['skipped_mtp'])} MTP "
          f"skipped; norm weights whose 1+(w-1) is not exact: {report['norm_roundtrip_inexact']}")
    print(f"  HF config kwargs: {json.dumps(hf_config_kwargs(hp))}")
    for k, v in sd.items():
        print(f"  {k:60s} {list(v.shape)}")
    for note in hp.notes:
        print(f"  note: {note}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="*", help="GGUF model files (qwen35moe / qwen35 / qwen3next)")
    ap.add_argument("--out", default="tests/golden/fixtures", help="fixture root; one folder per model")
    ap.add_argument("--name", default=None, help="fixture folder name (one GGUF only; default: file stem)")
    ap.add_argument("--n-tokens", type=int, default=96, help="sequence length N (>= 80, i.e. more than one "
                                                             "64-token GDN chunk)")
    ap.add_argument("--seed", type=int, default=20260101, help="token-id generator seed")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: most reproducible)")
    ap.add_argument("--full-logits-max-bytes", type=int, default=2 << 20,
                    help="store logits for every position when N*V*4 is at most this (else last 8 + top-16)")
    ap.add_argument("--last-logits", type=int, default=LAST_K_LOGITS,
                    help="when logits are not stored in full: how many final positions keep all V logits")
    ap.add_argument("--max-rel-diff", type=float, default=1e-3,
                    help="largest allowed prefill-vs-decode relative difference (max|a-b| / max|a|)")
    ap.add_argument("--convert-only", action="store_true", help="numpy only: parse, convert and describe")
    ap.add_argument("--self-test", action="store_true", help="numpy only: run the built-in tests and exit")
    args = ap.parse_args(argv)
    if args.self_test:
        import self_test
        return self_test.main()
    if not args.gguf:
        ap.error("give at least one GGUF file (or --self-test)")
    if args.name and len(args.gguf) > 1:
        ap.error("--name needs exactly one GGUF file")
    try:
        if args.convert_only:
            for p in args.gguf:
                convert_only(p)
            return 0
        if args.last_logits < 1:
            ap.error("--last-logits must be at least 1")
        if args.n_tokens < 80:
            ap.error("--n-tokens must be at least 80 (prefill must span more than one 64-token GDN chunk)")
        summary = [generate(p, args) for p in args.gguf]
    except DisagreementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (GgufError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\nprefill vs decode agreement (HF against itself):")
    print(f"  {'name':24s} {'arch':10s} {'hidden max rel':>15s} {'logits max abs':>15s} {'logits max rel':>15s}")
    for s in summary:
        print(f"  {s['name']:24s} {s['arch']:10s} {s['hidden_max_rel']:15.3e} {s['logits_max_abs']:15.3e} "
              f"{s['logits_max_rel']:15.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
