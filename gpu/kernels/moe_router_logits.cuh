// moe_router_logits.cuh: an f32 router's logits (ffn_gate_inp · x) for moe_imma's router-and-prepare kernel. Device
// code only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kestrel::gpu::moe_router_logits {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Router logits for an f32 router (ffn_gate_inp, the usual GGUF type): a block takes kRouterWarps experts (a warp
// each) for a group of up to kRouterTokens tokens; the warp holds its slice of the expert's row in registers (1024
// columns at a time) and multiplies it into each token's x in turn; lane partials in column order, then a butterfly:
// fixed order, bit-identical runs, the same bits whatever the grouping. (gemv()'s generic kernel re-stages x per row
// and vector: 144 µs for 32 tokens at E = 256, H = 2048; this takes a few.)
// kStaged (from kRouterStageMinTokens tokens): the group's x, 2048 columns (two passes) at a time, is first copied to
// shared memory by the whole block, so the block's 8 warps (experts) read it from there; fewer, larger stages keep the
// L2 round trips and barriers in the block's path few, and unstaged every warp would read all tokens' x through L1.
// Token groups of kRouterTokens spread the router over 8× the blocks of one group of 32 (each re-reading its experts'
// rows, from L2 after the first): 32 blocks on 32 SMs took 23 µs at 32 tokens.
constexpr int kRouterWarps = 8;
constexpr int kRouterChunk = 1024;                  // columns per pass: 32 lanes × 8 float4
constexpr int kRouterStageCols = 2 * kRouterChunk;  // columns of x staged at once: two passes
constexpr int kRouterTokens = 4;                    // tokens per block
constexpr int kRouterStageMinTokens = 2;

static_assert(kRouterTokens * kRouterStageCols * sizeof(float) <= 48 * 1024, "a group's staged x needs no opt-in");

inline size_t router_stage_bytes(int n_tok) {
  return static_cast<size_t>(std::min(n_tok, kRouterTokens)) * kRouterStageCols * sizeof(float);
}

inline int router_blocks_of(int n_expert, int n_tok) {
  return (n_expert + kRouterWarps - 1) / kRouterWarps * ((n_tok + kRouterTokens - 1) / kRouterTokens);
}

// Block `block`'s share, warp `warp` of it (kStaged: all kRouterWarps warps of the block call it together; unstaged,
// one warp alone computes expert block % expert_blocks · kRouterWarps + warp for its token group).
template <bool kStaged>
__device__ __forceinline__ void router_logits_block(const float* __restrict__ w, const float* __restrict__ x, int h,
                                                    int n_expert, int n_tok, float* __restrict__ logits, int block,
                                                    int warp, float4* xs) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int expert_blocks = (n_expert + kRouterWarps - 1) / kRouterWarps;
  const int e = block % expert_blocks * kRouterWarps + warp;
  const int t0 = block / expert_blocks * kRouterTokens;
  const int nt = min(kRouterTokens, n_tok - t0);
  if (!kStaged && e >= n_expert) return;  // staged: every warp takes part in the staging
  const bool active = e < n_expert;
  float acc[kRouterTokens];
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) acc[t] = 0.0f;
  const auto* wr = reinterpret_cast<const float4*>(w + static_cast<size_t>(active ? e : 0) * h);
  // The row a pass at a time, the next pass's weights loaded before this one's FMAs (one DRAM round trip in front of
  // the first FMA instead of one per pass).
  auto load_pass = [&](int c, float4(&wv)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int col = c + (i * 32 + lane) * 4;
      wv[i] = active && col < h ? __ldg(wr + col / 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  float4 wnext[8];
  load_pass(0, wnext);
  for (int c = 0; c < h; c += kRouterChunk) {
    float4 wv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[i] = wnext[i];
    if (c + kRouterChunk < h) load_pass(c + kRouterChunk, wnext);
    if constexpr (kStaged) {
      if (c % kRouterStageCols == 0) {
        if (c > 0) __syncthreads();  // the stage before is read
        // xs[t·(kRouterStageCols / 4) + q] = x[t0 + t][c + 4q .. +3] (zeros past h): every load issued before the
        // first store (a loop storing each as it came would wait on one L2 round trip per float4).
        constexpr int kQuads = kRouterTokens * (kRouterStageCols / 4);
        constexpr int kPerThread = kQuads / (kRouterWarps * 32);
        static_assert(kPerThread * kRouterWarps * 32 == kQuads, "the stage divides among the block's threads");
        float4 v[kPerThread];
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int q = static_cast<int>(threadIdx.x) + j * kRouterWarps * 32;
          const int t = q / (kRouterStageCols / 4);
          const int col = c + (q % (kRouterStageCols / 4)) * 4;
          v[j] = t < nt && col < h ? __ldg(reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + t) * h + col))
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int q = static_cast<int>(threadIdx.x) + j * kRouterWarps * 32;
          if (q < nt * (kRouterStageCols / 4)) xs[q] = v[j];
        }
        __syncthreads();
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int t = 0; t < kRouterTokens; ++t) {
        if (t >= nt || !active) break;
        const auto* xr = reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + t) * h);
#pragma unroll
        for (int i = 4 * half; i < 4 * half + 4; ++i) {
          const int col = c + (i * 32 + lane) * 4;
          if (col < h) {
            const float4 xv = kStaged ? xs[t * (kRouterStageCols / 4) + (c % kRouterStageCols) / 4 + i * 32 + lane]
                                      : __ldg(xr + col / 4);
            acc[t] = __fmaf_rn(wv[i].x, xv.x, acc[t]);
            acc[t] = __fmaf_rn(wv[i].y, xv.y, acc[t]);
            acc[t] = __fmaf_rn(wv[i].z, xv.z, acc[t]);
            acc[t] = __fmaf_rn(wv[i].w, xv.w, acc[t]);
          }
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) {
    if (t >= nt) break;
    float v = acc[t];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
    if (lane == 0) logits[static_cast<size_t>(t0 + t) * n_expert + e] = v;
  }
}

// The tiled form for many tokens (prompt passes): a warp takes kTileExperts experts × kTileTokens tokens, a block
// kRouterWarps such warps (kTileBlockExperts experts) for one token group. Per 512-column stage the block copies the
// group's x into shared memory; per float4 column of a lane the warp loads its experts' weights once (from L2) and
// uses each staged x float4 for kTileExperts · 4 FMAs, where router_logits_block uses it for 4: a register tile, so
// the block reads the router kTileTokens / kRouterTokens times less often and shared memory no longer bounds the FMA
// rate. Each logit's arithmetic is router_logits_block's: lane l's FMA chain over its columns c + (32i + l)·4 + j in
// ascending order from 0, then the same butterfly, so the logits are bit-identical to it (and so the routing of a
// prompt pass to that of calls of 32 tokens). Needs h % kTileStageCols == 0 and n_expert % kTileBlockExperts == 0.
constexpr int kTileExperts = 4;
constexpr int kTileTokens = 16;
constexpr int kTileBlockExperts = kRouterWarps * kTileExperts;
constexpr int kTileStageCols = 512;  // columns staged at once: 32 lanes × 4 float4
constexpr int kTileMinTokens = 64;   // from here on the tiled form
constexpr size_t kTileStageBytes = static_cast<size_t>(kTileTokens) * kTileStageCols * sizeof(float);  // 32 KiB

inline bool router_tile_takes(int n_expert, int h, int n_tok) {
  return n_tok >= kTileMinTokens && n_expert % kTileBlockExperts == 0 && h % kTileStageCols == 0;
}

inline int router_tile_blocks_of(int n_expert, int n_tok) {
  return n_expert / kTileBlockExperts * ((n_tok + kTileTokens - 1) / kTileTokens);
}

// Block `block`'s tile; every warp of the block calls it (they stage x together).
__device__ __forceinline__ void router_logits_tile(const float* __restrict__ w, const float* __restrict__ x, int h,
                                                   int n_expert, int n_tok, float* __restrict__ logits, int block,
                                                   float4* xs) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int expert_blocks = n_expert / kTileBlockExperts;
  const int e0 = block % expert_blocks * kTileBlockExperts + warp * kTileExperts;
  const int t0 = block / expert_blocks * kTileTokens;
  const int nt = min(kTileTokens, n_tok - t0);
  float acc[kTileTokens][kTileExperts];
#pragma unroll
  for (int t = 0; t < kTileTokens; ++t) {
#pragma unroll
    for (int e = 0; e < kTileExperts; ++e) acc[t][e] = 0.0f;
  }
  const auto* w4 = reinterpret_cast<const float4*>(w);
  const size_t row4 = static_cast<size_t>(h) / 4;
  constexpr int kQuads = kTileTokens * (kTileStageCols / 4);
  constexpr int kPerThread = kQuads / (kRouterWarps * 32);
  static_assert(kPerThread * kRouterWarps * 32 == kQuads, "the stage divides among the block's threads");
  for (int c = 0; c < h; c += kTileStageCols) {
    // xs[t·128 + q] = x[t0 + t][c + 4q .. +3] (zeros past the group's tokens), copied by cp.async: no registers held
    // across the barrier (the tile's accumulators take most of them).
    if (c > 0) __syncthreads();  // the stage before is read
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int q = static_cast<int>(threadIdx.x) + j * kRouterWarps * 32;
      const int t = q / (kTileStageCols / 4);
      if (t < nt) {
        const float4* src =
            reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + t) * h + c) + q % (kTileStageCols / 4);
        const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(xs + q));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
      } else {
        xs[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    // Lane l's columns of the stage: c + (32i + l)·4 .. +3 for i = 0..3 (i counts on across the stages of a 1024-column
    // pass of router_logits_block: the same columns in the same order).
#pragma unroll 1  // one column's weights in registers at a time: 64 accumulators + 16 weights, two blocks an SM
    for (int i = 0; i < kTileStageCols / 128; ++i) {
      const size_t q = static_cast<size_t>(c) / 4 + static_cast<size_t>(i) * 32 + static_cast<size_t>(lane);
      float4 wv[kTileExperts];
#pragma unroll
      for (int e = 0; e < kTileExperts; ++e) wv[e] = __ldg(w4 + static_cast<size_t>(e0 + e) * row4 + q);
#pragma unroll
      for (int t = 0; t < kTileTokens; ++t) {
        const float4 xv = xs[t * (kTileStageCols / 4) + i * 32 + lane];
#pragma unroll
        for (int e = 0; e < kTileExperts; ++e) {
          acc[t][e] = __fmaf_rn(wv[e].x, xv.x, acc[t][e]);
          acc[t][e] = __fmaf_rn(wv[e].y, xv.y, acc[t][e]);
          acc[t][e] = __fmaf_rn(wv[e].z, xv.z, acc[t][e]);
          acc[t][e] = __fmaf_rn(wv[e].w, xv.w, acc[t][e]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTileTokens; ++t) {
    if (t >= nt) break;
#pragma unroll
    for (int e = 0; e < kTileExperts; ++e) {
      float v = acc[t][e];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
      if (lane == 0) logits[static_cast<size_t>(t0 + t) * n_expert + e0 + e] = v;
    }
  }
}

}  // namespace kestrel::gpu::moe_router_logits
