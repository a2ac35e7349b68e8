// ServiceImpl's public methods (service_impl.h): model information, tokenizer calls, the sessions table and
// admission. Every check of a request happens here, before it is queued; the engine loop is in scheduler.cpp.
#include "daemon/engine/service_impl.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "core/tokenizer/tokenizer.h"

namespace kestrel::daemon {
namespace {

constexpr int32_t kMaxTopLogprobs = SamplingParams::kMaxLogprobs;

std::string str(int64_t v) { return std::to_string(v); }

Status check_top_logprobs(int32_t n) {
  if (n < 0 || n > kMaxTopLogprobs) {
    return make_error(ErrorCode::kInvalidArgument,
                      "top_logprobs must be between 0 and " + str(kMaxTopLogprobs) + " (got " + str(n) + ")");
  }
  return ok_status();
}

// The model's end-of-generation ids: the GGUF eos id plus <|im_end|> and <|endoftext|> when they are control tokens.
std::vector<int32_t> end_of_generation_ids(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  if (tok.vocab().eos_id >= 0) ids.push_back(tok.vocab().eos_id);
  for (const char* text : {"<|im_end|>", "<|endoftext|>"}) {
    const int32_t id = tok.find_token(text);
    if (id >= 0 && tok.is_control(id) && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace

ServiceImpl::ServiceImpl(const Model& model, Engine& engine, const ServiceLimits& limits)
    : model_(model), engine_(engine), limits_(limits), eos_ids_(end_of_generation_ids(model.tokenizer())) {
  const ModelHparams& hp = model_.hparams();
  if (hp.n_ctx_train > 0) {
    limits_.max_session_ctx = std::min<int32_t>(limits_.max_session_ctx, static_cast<int32_t>(hp.n_ctx_train));
  }
  limits_.default_n_ctx = std::min(limits_.default_n_ctx, limits_.max_session_ctx);
  limits_.default_idle_ttl = std::min(limits_.default_idle_ttl, limits_.max_idle_ttl);

  info_.architecture = std::string(arch_name(hp.arch));
  auto name = model_.file().get_string("general.name");
  info_.name = name ? *name : std::string();
  info_.engine = engine_.name();
  info_.model_path = model_.file().path();
  info_.n_vocab = static_cast<int32_t>(hp.n_vocab);
  info_.n_ctx_train = static_cast<int32_t>(hp.n_ctx_train);
  info_.max_session_ctx = limits_.max_session_ctx;
  info_.bos_token_id = model_.tokenizer().vocab().bos_id;
  info_.eos_token_ids = eos_ids_;
  info_.n_layer = static_cast<int32_t>(hp.n_layer);
  info_.n_embd = static_cast<int32_t>(hp.n_embd);
  info_.n_expert = static_cast<int32_t>(hp.n_expert);
  info_.n_expert_used = static_cast<int32_t>(hp.n_expert_used);
  info_.device = engine_.placement().device;
  info_.placement = engine_.placement().entries;
  info_.placement_summary = engine_.placement().summary;
  info_.file_bytes = model_.file().file_size();
  info_.chat_template = model_.tokenizer().vocab().chat_template;
}

ServiceImpl::~ServiceImpl() {
  drain(Clock::now());
  std::vector<SlotId> slots;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const std::shared_ptr<Session>& s : table_.all()) {
      slots.push_back(s->slot);
      table_.erase(s->id);
    }
  }
  free_slots(slots);
}

void ServiceImpl::start() {
  serving_ = true;
  thread_ = std::thread([this] { engine_loop(); });
  loop_id_ = thread_.get_id();
}

ServiceStats ServiceImpl::stats() const {
  ServiceStats st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    st.serving = serving_.load() && !draining_;
    st.sessions = static_cast<uint32_t>(table_.size());
    st.queued_steps = queued_;
    st.slots_held = slots_held_;
  }
  st.ticks = ticks_.load();
  st.tokens_processed = tokens_processed_.load();
  st.tokens_generated = tokens_generated_.load();
  st.cache = engine_.cache_pool();
  return st;
}

Expected<std::vector<int32_t>> ServiceImpl::tokenize(const std::string& text, bool parse_special) const {
  return model_.tokenizer().encode(text, parse_special);
}

Expected<std::string> ServiceImpl::detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const {
  const Tokenizer& tokenizer = model_.tokenizer();
  size_t bytes = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    Expected<std::string_view> piece = tokenizer.token_bytes(tokens[i]);
    if (!piece) {
      return make_error(ErrorCode::kInvalidArgument,
                        "cannot decode position " + std::to_string(i) + ": " + piece.error().message);
    }
    bytes += piece->size();
  }
  if (bytes > max_bytes) {
    return make_error(ErrorCode::kResourceExhausted, "the " + std::to_string(tokens.size()) + " tokens decode to " +
                                                         std::to_string(bytes) + " bytes, more than the " +
                                                         std::to_string(max_bytes) + " allowed");
  }
  return tokenizer.decode(tokens);
}

Status ServiceImpl::check_tokens(const std::vector<int32_t>& tokens, const char* what) const {
  if (tokens.empty())
    return make_error(ErrorCode::kInvalidArgument, std::string(what) + " is empty: give at least one token");
  const auto n_vocab = static_cast<int32_t>(model_.hparams().n_vocab);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      return make_error(ErrorCode::kInvalidArgument, std::string(what) + ": token id " + str(tokens[i]) + " at index " +
                                                         str(static_cast<int64_t>(i)) +
                                                         " is outside the vocabulary (0.." + str(n_vocab - 1) + ")");
    }
  }
  return ok_status();
}

Expected<std::shared_ptr<Session>> ServiceImpl::new_session(int32_t n_ctx, const SamplingOverrides& sampling,
                                                            std::chrono::seconds idle_ttl, uint64_t owner,
                                                            bool temporary) {
  if (n_ctx < 0)
    return make_error(ErrorCode::kInvalidArgument, "n_ctx must be >= 0 (0: the default), got " + str(n_ctx));
  if (n_ctx == 0) n_ctx = limits_.default_n_ctx;
  if (n_ctx > limits_.max_session_ctx) {
    // An admission limit (the daemon's context budget per session), like max_sessions: RESOURCE_EXHAUSTED.
    return make_error(ErrorCode::kResourceExhausted,
                      "n_ctx " + str(n_ctx) + " is larger than the largest session context, " +
                          str(limits_.max_session_ctx) + " (max_session_ctx, at most the model's training context " +
                          str(model_.hparams().n_ctx_train) + ")");
  }
  if (idle_ttl.count() < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "idle_ttl must be >= 0 s (0: the default), got " + str(idle_ttl.count()));
  }
  if (idle_ttl.count() == 0) idle_ttl = limits_.default_idle_ttl;
  if (idle_ttl > limits_.max_idle_ttl) {
    return make_error(ErrorCode::kOutOfRange, "idle_ttl " + str(idle_ttl.count()) + " s is longer than max_idle_ttl, " +
                                                  str(limits_.max_idle_ttl.count()) + " s");
  }
  SamplingParams params = sampling.apply_to(limits_.default_sampling);
  params.n_logprobs = 0;
  KESTREL_TRY(params.validate());
  const bool random_seed = !sampling.seed && limits_.random_seed_by_default && limits_.default_sampling.seed == 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (draining_) return make_error(ErrorCode::kUnavailable, "kestreld is draining (shutting down): no new sessions");
    if (slots_held_ + reserved_ >= limits_.max_sessions) {
      return make_error(
          ErrorCode::kResourceExhausted,
          "all " + str(limits_.max_sessions) + " sessions are in use (max_sessions); close one or raise the limit");
    }
    ++reserved_;
    if (random_seed) params.seed = table_.random_u64();
  }
  auto sampler = Sampler::create(params, static_cast<int32_t>(model_.hparams().n_vocab));
  Expected<SlotId> slot = make_error(ErrorCode::kInternal, "no slot");
  if (sampler) {
    std::lock_guard<std::mutex> lk(engine_mu_);
    slot = engine_.slot_alloc(n_ctx);
  }
  std::lock_guard<std::mutex> lk(mu_);
  --reserved_;
  if (!sampler) return std::move(sampler).error();
  if (!slot) return std::move(slot).error();
  ++slots_held_;
  auto s = std::make_shared<Session>(std::move(*sampler));
  s->slot = *slot;
  s->n_ctx = n_ctx;
  s->params = params;
  s->idle_ttl = idle_ttl;
  s->last_used = Clock::now();
  s->owner = owner;
  s->temporary = temporary;
  table_.insert(s);
  wake_.notify_one();  // the loop recomputes its next expiry
  return s;
}

Expected<SessionInfo> ServiceImpl::create_session(const SessionOptions& options) {
  KESTREL_TRY_ASSIGN(std::shared_ptr<Session> s,
                     new_session(options.n_ctx, options.sampling, options.idle_ttl, options.owner, false));
  std::lock_guard<std::mutex> lk(mu_);
  return s->info();
}

Expected<SessionInfo> ServiceImpl::clone_session(SessionId id, uint64_t owner) {
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_) return make_error(ErrorCode::kUnavailable, "kestreld is draining (shutting down): no new sessions");
  std::shared_ptr<Session> src = table_.find(id);
  if (!src)
    return make_error(ErrorCode::kNotFound, "no session " + std::to_string(id) + " (closed, expired or never created)");
  if (src->active) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "session " + std::to_string(id) + " is busy with a request; clone it when the request is done");
  }
  if (slots_held_ + reserved_ >= limits_.max_sessions) {
    return make_error(
        ErrorCode::kResourceExhausted,
        "all " + str(limits_.max_sessions) + " sessions are in use (max_sessions); close one or raise the limit");
  }
  auto dst = std::make_shared<Session>(src->sampler.clone());
  {
    std::lock_guard<std::mutex> elk(engine_mu_);  // mu_ before engine_mu_ (service_impl.h)
    KESTREL_TRY_ASSIGN(dst->slot, engine_.slot_alloc(src->n_ctx));
    if (Status st = engine_.slot_clone(src->slot, dst->slot); !st) {
      engine_.slot_free(dst->slot);
      return st.error();
    }
  }
  ++slots_held_;
  dst->n_ctx = src->n_ctx;
  dst->fed = src->fed;
  dst->pending = src->pending;
  dst->params = src->params;
  dst->idle_ttl = src->idle_ttl;
  dst->last_used = src->last_used = Clock::now();
  dst->owner = owner;
  table_.insert(dst);
  wake_.notify_one();
  return dst->info();
}

Expected<SessionInfo> ServiceImpl::reset_session(SessionId id) {
  std::lock_guard<std::mutex> lk(mu_);
  std::shared_ptr<Session> s = table_.find(id);
  if (!s)
    return make_error(ErrorCode::kNotFound, "no session " + std::to_string(id) + " (closed, expired or never created)");
  if (s->active) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "session " + std::to_string(id) + " is busy with a request; abort it or wait before resetting");
  }
  {
    std::lock_guard<std::mutex> elk(engine_mu_);
    engine_.slot_reset(s->slot);
  }
  s->fed.clear();
  s->pending.clear();
  s->last_used = Clock::now();
  return s->info();
}

Status ServiceImpl::close_locked(SessionId id, std::vector<SlotId>* slots_to_free) {
  std::shared_ptr<Session> s = table_.erase(id);
  if (!s)
    return make_error(ErrorCode::kNotFound, "no session " + std::to_string(id) + " (closed, expired or never created)");
  if (s->active) {
    s->closed = true;  // the engine loop frees the slot when the request ends
    int none = static_cast<int>(AbortCause::kNone);
    s->active->abort.compare_exchange_strong(none, static_cast<int>(AbortCause::kClosed));
    wake_.notify_one();
  } else {
    slots_to_free->push_back(s->slot);
  }
  return ok_status();
}

void ServiceImpl::free_slots(const std::vector<SlotId>& slots) {
  if (slots.empty()) return;
  {
    std::lock_guard<std::mutex> lk(engine_mu_);
    for (SlotId slot : slots) engine_.slot_free(slot);
  }
  std::lock_guard<std::mutex> lk(mu_);
  slots_held_ -= static_cast<uint32_t>(slots.size());
}

Status ServiceImpl::close_session(SessionId id) {
  std::vector<SlotId> slots;
  Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    st = close_locked(id, &slots);
  }
  free_slots(slots);
  return st;
}

uint32_t ServiceImpl::close_owned_by(uint64_t owner) {
  std::vector<SlotId> slots;
  uint32_t n = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (SessionId id : table_.ids_owned_by(owner)) {
      if (close_locked(id, &slots)) ++n;
    }
  }
  free_slots(slots);
  return n;
}

Status ServiceImpl::admit(const std::shared_ptr<Request>& request, SessionId id, const SamplingOverrides& sampling,
                          int32_t top_logprobs) {
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_) return make_error(ErrorCode::kUnavailable, "kestreld is draining (shutting down): retry elsewhere");
  std::shared_ptr<Session> s = table_.find(id);
  if (!s)
    return make_error(ErrorCode::kNotFound, "no session " + std::to_string(id) + " (closed, expired or never created)");
  if (s->active) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "session " + std::to_string(id) + " is busy with another request; wait for it or abort it");
  }
  if (queued_ >= limits_.max_queued_steps) {
    return make_error(ErrorCode::kResourceExhausted, "the request queue is full (max_queued_steps = " +
                                                         str(limits_.max_queued_steps) + "); retry later");
  }
  SamplingParams params = sampling.apply_to(s->params);
  params.n_logprobs = top_logprobs;
  KESTREL_TRY(params.validate());
  const int64_t need = s->n_past() + static_cast<int64_t>(request->todo.size());
  if (need > s->n_ctx) {
    return make_error(ErrorCode::kOutOfRange, "the session holds " + str(s->n_past()) + " of " + str(s->n_ctx) +
                                                  " context tokens; " +
                                                  str(static_cast<int64_t>(request->todo.size())) +
                                                  " more do not fit (reset or clone into a larger context)");
  }
  request->params = params;
  request->reseed = sampling.seed.has_value();
  request->n_from_pending = s->pending.size();
  request->todo.insert(request->todo.begin(), s->pending.begin(), s->pending.end());
  s->pending.clear();
  request->session = s;
  request->admitted = Clock::now();
  s->active = request;
  ++queued_;
  metrics_.admitted(request->transport);
  incoming_.push_back(request);
  wake_.notify_one();
  return ok_status();
}

void ServiceImpl::step(StepRequest request, std::function<void(Expected<StepResult>)> done) {
  const Transport transport = request.transport;
  auto refuse = [&](Error e) {
    metrics_.failed(transport, /*was_admitted=*/false, /*was_scheduled=*/false, e.code);
    done(std::move(e));
  };
  if (Status st = check_tokens(request.tokens, "step tokens"); !st) return refuse(std::move(st).error());
  if (Status st = check_top_logprobs(request.top_logprobs); !st) return refuse(std::move(st).error());
  auto r = std::make_shared<Request>();
  r->kind = Request::Kind::kStep;
  r->todo = std::move(request.tokens);
  r->deadline = request.deadline;
  r->transport = transport;
  r->done = std::move(done);
  if (Status st = admit(r, request.session, request.sampling, request.top_logprobs); !st) {
    done = std::move(r->done);  // admit() refused it: the callback goes back to `refuse`
    refuse(std::move(st).error());
  }
}

void ServiceImpl::generate(GenerateRequest request, std::shared_ptr<GenerateSink> sink) {
  const Transport transport = request.transport;
  auto refuse = [&](Error e) {
    metrics_.failed(transport, /*was_admitted=*/false, /*was_scheduled=*/false, e.code);
    sink->on_done(std::move(e));
  };
  if (Status st = check_tokens(request.prompt, "generate prompt"); !st) return refuse(std::move(st).error());
  if (Status st = check_top_logprobs(request.top_logprobs); !st) return refuse(std::move(st).error());
  if (request.max_tokens <= 0) {
    return refuse(
        make_error(ErrorCode::kInvalidArgument, "max_tokens must be > 0 (got " + str(request.max_tokens) + ")"));
  }
  if (Status st = request.sampling.apply_to(limits_.default_sampling).validate(); !st) {
    return refuse(std::move(st).error());
  }
  SessionId id = request.session;
  if (id == 0) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!draining_ && queued_ >= limits_.max_queued_steps) {
        return refuse(make_error(ErrorCode::kResourceExhausted, "the request queue is full (max_queued_steps = " +
                                                                    str(limits_.max_queued_steps) + "); retry later"));
      }
    }
    auto s = new_session(request.n_ctx, SamplingOverrides{}, std::chrono::seconds(0), request.owner, true);
    if (!s) return refuse(std::move(s).error());
    id = (*s)->id;
  }
  auto r = std::make_shared<Request>();
  r->kind = Request::Kind::kGenerate;
  r->todo = std::move(request.prompt);
  r->prompt_tokens = static_cast<uint32_t>(r->todo.size());
  r->deadline = request.deadline;
  r->transport = transport;
  r->sink = sink;
  r->max_tokens = request.max_tokens;
  r->stop_tokens = std::move(request.stop_tokens);
  if (!request.ignore_eos) r->stop_tokens.insert(r->stop_tokens.end(), eos_ids_.begin(), eos_ids_.end());
  r->text = std::make_unique<TextStream>(model_.tokenizer(), std::move(request.stop_strings));
  if (Status st = admit(r, id, request.sampling, request.top_logprobs); !st) {
    if (request.session == 0) (void)close_session(id);
    refuse(std::move(st).error());
  }
}

Expected<bool> ServiceImpl::abort(SessionId id) {
  std::lock_guard<std::mutex> lk(mu_);
  std::shared_ptr<Session> s = table_.find(id);
  if (!s)
    return make_error(ErrorCode::kNotFound, "no session " + std::to_string(id) + " (closed, expired or never created)");
  if (!s->active) return false;
  int none = static_cast<int>(AbortCause::kNone);
  s->active->abort.compare_exchange_strong(none, static_cast<int>(AbortCause::kAbort));
  wake_.notify_one();
  return true;
}

void ServiceImpl::drain(Clock::time_point deadline) {
  if (std::this_thread::get_id() == loop_id_) {  // from a callback: stop admitting; the owner joins later
    std::lock_guard<std::mutex> lk(mu_);
    draining_ = true;
    return;
  }
  std::lock_guard<std::mutex> dlk(drain_mu_);
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!draining_) drain_time_ = std::max(Clock::duration::zero(), deadline - Clock::now());
    draining_ = true;
    idle_.wait_until(lk, deadline, [&] { return queued_ == 0; });
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  serving_ = false;
}

Expected<std::unique_ptr<Service>> make_service(const Model& model, Engine& engine, const ServiceLimits& limits) {
  auto bad = [](const std::string& what) { return make_error(ErrorCode::kInvalidArgument, "service limits: " + what); };
  if (limits.max_sessions < 1) return bad("max_sessions must be >= 1");
  if (limits.max_queued_steps < 1) return bad("max_queued_steps must be >= 1");
  if (limits.default_n_ctx < 1) return bad("default_n_ctx must be >= 1, got " + str(limits.default_n_ctx));
  if (limits.max_session_ctx < 1) return bad("max_session_ctx must be >= 1, got " + str(limits.max_session_ctx));
  if (limits.max_batch_tokens < 1) return bad("max_batch_tokens must be >= 1, got " + str(limits.max_batch_tokens));
  if (limits.default_idle_ttl.count() < 1 || limits.max_idle_ttl.count() < 1) return bad("idle TTLs must be >= 1 s");
  if (Status st = limits.default_sampling.validate(); !st) return bad("default sampling: " + st.error().message);
  if (engine.hparams().n_vocab != model.hparams().n_vocab || engine.hparams().n_layer != model.hparams().n_layer) {
    return bad("the engine was built for a different model than the one given");
  }
  auto service = std::make_unique<ServiceImpl>(model, engine, limits);
  service->start();
  return std::unique_ptr<Service>(std::move(service));
}

}  // namespace kestrel::daemon
