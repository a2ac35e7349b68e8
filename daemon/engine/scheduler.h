// The engine loop's vocabulary (design.md §3 "Scheduling"): one in-flight request per session and the rule that
// shares a tick's token budget among them.
//
// Each tick the loop (ServiceImpl::engine_loop, scheduler.cpp) ends the requests that were aborted, cancelled or
// timed out, asks every other request for its next piece of work — the rest of a step's or a prompt's tokens, or
// the one token a generation fed back, a prompt's capped at the engine's max_tokens_per_item — shares
// limits.max_batch_tokens (or, while some session decodes and the engine names one, its max_tokens_per_tick, raised to
// one token per request; beside decoding sessions, prompts get at most the engine's prompt_tokens_beside_decode share)
// among them with
// allocate_tick_tokens(), runs
// ONE Engine::step() over all of them, samples each finished prefill or decode, and delivers results through the
// callbacks and sinks (on the loop thread, with no lock held).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/sampler/sampling_params.h"
#include "daemon/engine/service.h"
#include "daemon/engine/text_stream.h"

namespace kestrel::daemon {

struct Session;

// Why a request was told to stop early (Request::abort).
enum class AbortCause : int { kNone = 0, kAbort = 1, kClosed = 2, kDrain = 3 };

// One step() or generate() from admission to its final callback. Created by the caller's thread under the Service
// mutex, then touched only by the engine loop thread, except `abort`, which any thread may set.
struct Request {
  enum class Kind { kStep, kGenerate };
  Kind kind = Kind::kStep;
  std::shared_ptr<Session> session;
  std::vector<int32_t> todo;  // the session's pending tokens, then the request's tokens (or prompt)
  size_t n_from_pending = 0;  // how many of todo came from the session's pending tokens
  size_t consumed = 0;        // todo[0, consumed) are in the slot
  SamplingParams params;      // effective parameters for this request (overrides applied, n_logprobs set)
  bool reseed = false;        // the request carried its own seed: the session's stream restarts from it
  bool started = false;       // params applied to the session's sampler
  Deadline deadline;
  std::atomic<int> abort{0};  // AbortCause

  // Metrics (service_metrics.h): the transport label, when it was admitted, whether the loop has given it tokens yet,
  // when its last token was sampled.
  Transport transport = Transport::kGrpc;
  Clock::time_point admitted;
  bool scheduled = false;
  Clock::time_point last_token;

  // kStep
  std::function<void(Expected<StepResult>)> done;

  // kGenerate
  std::shared_ptr<GenerateSink> sink;
  int32_t max_tokens = 0;
  std::vector<int32_t> stop_tokens;  // the request's stop tokens plus the model's EOS ids unless ignore_eos
  std::unique_ptr<TextStream> text;
  uint32_t prompt_tokens = 0;
  uint32_t generated = 0;
  bool decoding = false;  // the prompt is in; next_token is the emitted token to feed next
  int32_t next_token = -1;

  size_t remaining() const { return decoding ? 1 : todo.size() - consumed; }
};

// Shares `budget` tokens among requests wanting demands[i] (>= 0) tokens each: water-filling, so small demands
// (decodes) are met in full and what is left is split evenly among the prefills. When there are more requests than
// tokens, the ones first in the rotation (starting at index rotation % n) get one each. Returns tokens per request
// (0: waits for a later tick); the sum is <= budget. Pure function.
std::vector<size_t> allocate_tick_tokens(const std::vector<size_t>& demands, size_t budget, uint64_t rotation);

}  // namespace kestrel::daemon
