// The engine loop (scheduler.h): ServiceImpl::engine_loop and its tick, plus allocate_tick_tokens.
//
// One tick: (1) end the requests that were aborted, whose sink was cancelled or whose deadline passed; (2) share the
// token budget; (3) under engine_mu_, run one Engine::step() over every request that got tokens, sample where a
// prefill or decode completed, decide finishes; (4) under mu_, release finished sessions (busy flag, temporary
// sessions, queue count); (5) free slots; (6) deliver chunks and results with no lock held.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "daemon/engine/service_impl.h"

namespace kestrel::daemon {

std::vector<size_t> allocate_tick_tokens(const std::vector<size_t>& demands, size_t budget, uint64_t rotation) {
  const size_t n = demands.size();
  std::vector<size_t> alloc(n, 0);
  if (n == 0) return alloc;
  std::vector<size_t> open;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (static_cast<size_t>(rotation % n) + k) % n;
    if (demands[i] > 0) open.push_back(i);
  }
  size_t left = budget;
  while (left > 0 && !open.empty()) {
    const size_t share = left / open.size();
    if (share == 0) {
      for (size_t k = 0; k < left; ++k) alloc[open[k]] += 1;
      break;
    }
    std::vector<size_t> still_open;
    for (size_t i : open) {
      const size_t g = std::min(share, demands[i] - alloc[i]);
      alloc[i] += g;
      left -= g;
      if (alloc[i] < demands[i]) still_open.push_back(i);
    }
    open = std::move(still_open);
  }
  return alloc;
}

namespace {

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string abort_message(AbortCause cause, SessionId id) {
  switch (cause) {
    case AbortCause::kClosed: return "session " + std::to_string(id) + " was closed while the request ran";
    default: return "the request was aborted";
  }
}

// Why a request was cut by the end of a drain: `what` is "step" or "generation".
std::string shutdown_message(const char* what, Clock::duration drain_time) {
  const auto ms = std::chrono::round<std::chrono::milliseconds>(drain_time).count();
  if (ms < 1) {
    return std::string("kestreld is stopping without a drain period: this ") + what + " was cut before it finished";
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.3g", static_cast<double>(ms) / 1000.0);
  return std::string("kestreld is shutting down: its drain time of ") + seconds + " s ran out before this " + what +
         " finished";
}

// What a request had put into its session before the engine failed it (the tokens of earlier ticks stay fed), for
// the error's message: a client that retries must send only the rest. Empty when nothing of the request was fed.
std::string progress_before_failure(const Request& r) {
  const Session& s = *r.session;
  const std::string past = s.temporary ? "" : "; the session's n_past is now " + std::to_string(s.n_past());
  if (r.kind == Request::Kind::kGenerate && r.decoding) {
    return " (after the prompt and " + std::to_string(r.generated) + " generated tokens" + past + ")";
  }
  const size_t own = r.todo.size() - r.n_from_pending;
  const size_t own_fed = r.consumed > r.n_from_pending ? r.consumed - r.n_from_pending : 0;
  if (own_fed == 0) return "";
  return " (after " + std::to_string(own_fed) + " of the request's " + std::to_string(own) + " tokens were fed" + past +
         ")";
}

}  // namespace

void ServiceImpl::engine_loop() {
  std::vector<Outcome> outcomes;
  for (;;) {
    std::vector<SlotId> expired;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        while (!incoming_.empty()) {
          active_.push_back(std::move(incoming_.front()));
          incoming_.pop_front();
        }
        for (const std::shared_ptr<Session>& s : table_.take_expired(Clock::now())) expired.push_back(s->slot);
        stopping = stop_;
        stop_drain_time_ = drain_time_;
        if (!active_.empty() || stopping || !expired.empty()) break;
        if (auto next = table_.next_expiry()) {
          wake_.wait_until(lk, *next);
        } else {
          wake_.wait(lk);
        }
      }
    }
    free_slots(expired);
    if (stopping) {
      for (const std::shared_ptr<Request>& r : active_) {
        int none = static_cast<int>(AbortCause::kNone);
        r->abort.compare_exchange_strong(none, static_cast<int>(AbortCause::kDrain));
      }
      if (active_.empty()) return;
    }
    if (active_.empty()) continue;
    outcomes.clear();
    tick(&outcomes);
    finish(&outcomes);
  }
}

void ServiceImpl::end_request(Request& r) {
  Session& s = *r.session;
  if (r.kind == Request::Kind::kGenerate && r.decoding && r.next_token >= 0) {
    s.pending.assign(1, r.next_token);  // emitted, not fed: the next request feeds it first
  } else if (r.consumed < r.n_from_pending) {
    s.pending.assign(r.todo.begin() + static_cast<std::ptrdiff_t>(r.consumed),
                     r.todo.begin() + static_cast<std::ptrdiff_t>(r.n_from_pending));
  }
  if (r.started) (void)s.sampler.set_params(s.params);  // validated at creation; the RNG stream continues
}

void ServiceImpl::tick(std::vector<Outcome>* outcomes) {
  const Clock::time_point now = Clock::now();

  // (1) Requests that end before running again.
  std::vector<std::shared_ptr<Request>> running;
  running.reserve(active_.size());
  for (std::shared_ptr<Request>& rp : active_) {
    Request& r = *rp;
    Outcome o;
    o.request = rp;
    const auto cause = static_cast<AbortCause>(r.abort.load());
    if (cause != AbortCause::kNone) {
      if (r.kind == Request::Kind::kStep) {
        o.step_result = cause == AbortCause::kDrain
                            ? make_error(ErrorCode::kUnavailable,
                                         shutdown_message("step", stop_drain_time_) + "; retry on another kestreld")
                            : make_error(ErrorCode::kCancelled, abort_message(cause, r.session->id));
      } else {
        std::string rest = r.text->finish();
        if (!rest.empty()) {
          GenerateChunk c;
          c.text = std::move(rest);
          c.session = r.session->temporary ? 0 : r.session->id;
          c.n_past = r.session->n_fed() + (r.decoding && r.next_token >= 0 ? 1 : 0);
          o.chunks.push_back(std::move(c));
        }
        GenerateSummary sum;
        if (cause == AbortCause::kDrain) {
          sum.reason = FinishReason::kShutdown;
          sum.message = shutdown_message("generation", stop_drain_time_);
        } else {
          sum.reason = FinishReason::kAborted;
        }
        sum.prompt_tokens = r.prompt_tokens;
        sum.completion_tokens = r.generated;
        sum.session = r.session->temporary ? 0 : r.session->id;
        sum.n_past = r.session->n_fed() + (r.decoding && r.next_token >= 0 ? 1 : 0);
        o.generate_result = sum;
      }
      o.finished = true;
    } else if (r.sink && r.sink->cancelled()) {
      o.generate_result = make_error(ErrorCode::kCancelled, "the client cancelled the generation");
      o.finished = true;
    } else if (r.deadline && now >= *r.deadline) {
      Error e = make_error(ErrorCode::kDeadlineExceeded,
                           r.kind == Request::Kind::kStep
                               ? "the deadline passed after " + std::to_string(r.consumed) + " of " +
                                     std::to_string(r.todo.size()) + " tokens"
                               : "the deadline passed after " + std::to_string(r.generated) + " generated tokens");
      if (r.kind == Request::Kind::kStep) {
        o.step_result = std::move(e);
      } else {
        o.generate_result = std::move(e);
      }
      o.finished = true;
    }
    if (o.finished) {
      end_request(r);
      outcomes->push_back(std::move(o));
    } else {
      running.push_back(std::move(rp));
    }
  }
  active_ = std::move(running);
  if (active_.empty()) return;

  // (2) Share the budget.
  std::vector<size_t> demands;
  demands.reserve(active_.size());
  // A prompt asks for at most the engine's max_tokens_per_item a tick (an engine that runs a prompt a token per pass
  // would otherwise hold every decoding session for the whole prompt); the rest waits for the next tick.
  const EngineCapabilities caps = engine_.capabilities();
  const size_t per_item = static_cast<size_t>(std::max(caps.max_tokens_per_item, 0));
  size_t decoding = 0;
  for (const std::shared_ptr<Request>& r : active_) {
    demands.push_back(per_item > 0 ? std::min(r->remaining(), per_item) : r->remaining());
    decoding += r->decoding ? 1 : 0;
  }
  // While sessions decode, an engine whose pass holds max_tokens_per_tick tokens gets prompts only what the decoding
  // sessions leave of one pass (at least a token each): a prompt's chunk then shares the decoders' pass instead of
  // adding one. With no session decoding, prompts take up to max_tokens_per_item each (the engine's prompt passes).
  size_t budget = static_cast<size_t>(limits_.max_batch_tokens);
  if (caps.max_tokens_per_tick > 0 && decoding > 0) {
    const size_t prompts = active_.size() - decoding;
    budget = std::min(budget, std::max(static_cast<size_t>(caps.max_tokens_per_tick), decoding + prompts));
  }
  // Beside decoding sessions prompts get only the engine's share (prompt_tokens_beside_decode, engine.h), so a long
  // prompt stretches their inter-token latency by a bounded factor; still at least a token each.
  if (const size_t share = prompt_tokens_beside_decode(caps, decoding); share != SIZE_MAX) {
    const size_t prompts = active_.size() - decoding;
    budget = std::min(budget, decoding + std::max(share, prompts));
  }
  const std::vector<size_t> alloc = allocate_tick_tokens(demands, budget, rotation_++);
  std::vector<size_t> which;  // index into active_ of each item
  std::vector<EngineStepItem> items;
  for (size_t i = 0; i < active_.size(); ++i) {
    if (alloc[i] == 0) continue;
    Request& r = *active_[i];
    EngineStepItem item;
    item.slot = r.session->slot;
    // Greedy without penalties or log-probabilities is the argmax itself: the engine may compute it on its device.
    item.argmax_only = r.params.temperature == 0.0f && !r.params.penalties_active() && r.params.n_logprobs == 0;
    if (r.decoding) {
      item.tokens = std::span<const int32_t>(&r.next_token, 1);
    } else {
      item.tokens = std::span<const int32_t>(r.todo.data() + r.consumed, alloc[i]);
    }
    items.push_back(item);
    which.push_back(i);
  }
  std::vector<EngineStepOutput> outs(items.size());
  const size_t n_vocab = engine_.hparams().n_vocab;
  if (tick_logits_.size() < items.size() * n_vocab) tick_logits_.resize(items.size() * n_vocab);
  for (size_t k = 0; k < items.size(); ++k)
    outs[k].logits = std::span<float>(tick_logits_.data() + k * n_vocab, n_vocab);

  // (3) One forward over the batch, then sampling.
  {
    std::lock_guard<std::mutex> lk(engine_mu_);
    for (size_t k = 0; k < items.size(); ++k) {
      Request& r = *active_[which[k]];
      if (!r.started) {
        (void)r.session->sampler.set_params(r.params);  // validated at admission
        if (r.reseed) r.session->sampler.reseed(r.params.seed);
        r.started = true;
      }
      if (!r.scheduled) {
        r.scheduled = true;
        metrics_.scheduled(r.transport, std::chrono::duration<double>(now - r.admitted).count());
      }
    }
    engine_.step(items, outs);
    const Clock::time_point sampled_at = Clock::now();
    for (size_t k = 0; k < items.size(); ++k) {
      Request& r = *active_[which[k]];
      Outcome o;
      o.request = active_[which[k]];
      if (!outs[k].status) {
        Error e = std::move(outs[k].status).error();
        end_request(r);
        e.message += progress_before_failure(r);
        if (r.kind == Request::Kind::kStep) {
          o.step_result = std::move(e);
        } else {
          o.generate_result = std::move(e);
        }
        o.finished = true;
        outcomes->push_back(std::move(o));
        continue;
      }
      const size_t n = items[k].tokens.size();
      r.session->fed.insert(r.session->fed.end(), items[k].tokens.begin(), items[k].tokens.end());
      tokens_processed_ += n;
      if (r.decoding) {
        r.next_token = -1;  // fed
      } else {
        r.consumed += n;
        if (r.consumed < r.todo.size()) continue;  // more prefill next tick
      }
      sample_and_advance(r, outs[k].logits, items[k].argmax_only ? outs[k].argmax : -1, sampled_at, &o);
      if (o.finished) end_request(r);
      if (o.finished || !o.chunks.empty()) outcomes->push_back(std::move(o));
    }
  }
  ++ticks_;
  std::vector<std::shared_ptr<Request>> still;
  for (const Outcome& o : *outcomes) {
    if (!o.finished) continue;
    for (std::shared_ptr<Request>& r : active_) {
      if (r == o.request) r.reset();
    }
  }
  for (std::shared_ptr<Request>& r : active_) {
    if (r) still.push_back(std::move(r));
  }
  active_ = std::move(still);
}

void ServiceImpl::record_token(Request& r, Clock::time_point now) {
  if (r.last_token == Clock::time_point{}) {
    // The first token: the prompt (the request's own tokens, not the session's pending one) is processed.
    const auto prompt = static_cast<uint64_t>(r.todo.size() - r.n_from_pending);
    metrics_.first_token(r.transport, std::chrono::duration<double>(now - r.admitted).count(), prompt);
  } else {
    metrics_.next_token(r.transport, std::chrono::duration<double>(now - r.last_token).count());
  }
  r.last_token = now;
}

void ServiceImpl::sample_and_advance(Request& r, std::span<const float> logits, int32_t greedy, Clock::time_point now,
                                     Outcome* o) {
  Session& s = *r.session;
  SampleResult sr;
  if (r.kind == Request::Kind::kStep) {
    auto tok = greedy >= 0 ? Expected<int32_t>(greedy) : s.sampler.sample_checked(logits, s.fed, &sr);
    if (!tok) {
      o->step_result = std::move(tok).error();
    } else {
      record_token(r, now);
      StepResult res;
      res.token = *tok;
      res.logprob = sr.logprob;
      res.top = std::move(sr.top);
      res.n_past = s.n_past();
      o->step_result = std::move(res);
    }
    o->finished = true;
    return;
  }

  r.decoding = true;
  const SessionId visible_id = s.temporary ? 0 : s.id;
  std::optional<FinishReason> reason;
  GenerateChunk c;
  c.session = visible_id;
  if (s.n_fed() >= s.n_ctx) {
    reason = FinishReason::kContextFull;  // no room to feed another token
    c.text = r.text->finish();
  } else {
    auto tok = greedy >= 0 ? Expected<int32_t>(greedy) : s.sampler.sample_checked(logits, s.fed, &sr);
    if (!tok) {
      o->generate_result = std::move(tok).error();
      o->finished = true;
      return;
    }
    const int32_t t = *tok;
    r.next_token = t;
    ++r.generated;
    ++tokens_generated_;
    record_token(r, now);
    c.tokens.push_back(t);
    if (contains(r.stop_tokens, t)) {
      reason = FinishReason::kStopToken;
      c.text = r.text->finish();
    } else {
      auto text = r.text->push(t);  // an id past the tokenizer's vocabulary (padding rows) has no text
      if (text) c.text = std::move(*text);
      if (r.text->stopped()) {
        reason = FinishReason::kStopString;
      } else if (r.generated >= static_cast<uint32_t>(r.max_tokens)) {
        reason = FinishReason::kMaxTokens;
        c.text += r.text->finish();
      }
    }
    if (r.params.n_logprobs > 0) {
      StepResult lp;
      lp.token = t;
      lp.logprob = sr.logprob;
      lp.top = std::move(sr.top);
      lp.n_past = s.n_fed() + 1;
      c.logprobs.push_back(std::move(lp));
    }
  }
  c.n_past = s.n_fed() + (r.next_token >= 0 ? 1 : 0);
  if (!c.tokens.empty() || !c.text.empty()) o->chunks.push_back(std::move(c));
  if (reason) {
    GenerateSummary sum;
    sum.reason = *reason;
    sum.prompt_tokens = r.prompt_tokens;
    sum.completion_tokens = r.generated;
    sum.session = visible_id;
    sum.n_past = s.n_fed() + (r.next_token >= 0 ? 1 : 0);
    o->generate_result = sum;
    o->finished = true;
  }
}

void ServiceImpl::record_end(const Request& r, const Outcome& o) {
  const double e2e = std::chrono::duration<double>(Clock::now() - r.admitted).count();
  if (o.step_result) {
    if (*o.step_result) {
      metrics_.succeeded(r.transport, r.scheduled, FinishClass::kStep, e2e);
    } else {
      metrics_.failed(r.transport, /*was_admitted=*/true, r.scheduled, o.step_result->error().code);
    }
    return;
  }
  if (!o.generate_result) return;
  if (!*o.generate_result) {
    metrics_.failed(r.transport, /*was_admitted=*/true, r.scheduled, o.generate_result->error().code);
    return;
  }
  FinishClass finish = FinishClass::kStop;
  switch ((*o.generate_result)->reason) {
    case FinishReason::kStopToken:
    case FinishReason::kStopString: finish = FinishClass::kStop; break;
    case FinishReason::kMaxTokens:
    case FinishReason::kContextFull: finish = FinishClass::kLength; break;
    case FinishReason::kAborted:
    case FinishReason::kShutdown: finish = FinishClass::kAbort; break;  // vLLM's "abort": ended by the server too
  }
  metrics_.succeeded(r.transport, r.scheduled, finish, e2e);
}

void ServiceImpl::finish(std::vector<Outcome>* outcomes) {
  std::vector<SlotId> to_free;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const Clock::time_point now = Clock::now();
    for (Outcome& o : *outcomes) {
      if (!o.finished) continue;
      Session& s = *o.request->session;
      s.active = nullptr;
      s.last_used = now;
      --queued_;
      if (s.temporary && !s.closed) table_.erase(s.id);
      if (s.temporary || s.closed) to_free.push_back(s.slot);
    }
    if (queued_ == 0) idle_.notify_all();
  }
  free_slots(to_free);
  for (Outcome& o : *outcomes) {
    Request& r = *o.request;
    if (o.finished) record_end(r, o);
    for (GenerateChunk& c : o.chunks) r.sink->on_chunk(std::move(c));
    if (o.step_result) {
      auto done = std::move(r.done);
      done(std::move(*o.step_result));
    }
    if (o.generate_result) {
      auto sink = std::move(r.sink);
      sink->on_done(std::move(*o.generate_result));
    }
  }
  outcomes->clear();
}

}  // namespace kestrel::daemon
