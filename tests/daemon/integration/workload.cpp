// Deterministic client workloads (workload.h).
#include "tests/daemon/integration/workload.h"

namespace kestrel::itest {

Expected<std::vector<int32_t>> run_workload(client::Client& c, int id) {
  std::vector<int32_t> out;
  v1::TokenizeRequest tok;
  tok.set_text("Request " + std::to_string(id) + ": the kestrel hovers " +
               std::string(static_cast<size_t>(id % 3), '!') + " over field number " + std::to_string(id * 7));
  KESTREL_TRY_ASSIGN(const v1::TokenizeResponse prompt, c.tokenize(tok));

  v1::CreateSessionRequest create;
  create.set_n_ctx(512);
  create.mutable_sampling()->set_temperature(0.0f);
  KESTREL_TRY_ASSIGN(const v1::SessionInfo session, c.create_session(create));
  v1::StepRequest step;
  step.set_session_id(session.session_id());
  *step.mutable_tokens() = prompt.tokens();
  for (int i = 0; i < 7; ++i) {
    KESTREL_TRY_ASSIGN(const v1::StepResponse r, c.step(step));
    out.push_back(r.token());
    step.clear_tokens();
    step.add_tokens(r.token());
  }
  v1::GenerateRequest gen;
  gen.set_session_id(session.session_id());
  gen.mutable_tokens()->add_ids(out.back());
  gen.set_max_tokens(10);
  gen.set_ignore_eos(true);
  gen.mutable_sampling()->set_temperature(0.0f);
  KESTREL_TRY(c.generate(gen, [&](const v1::GenerateChunk& chunk) {
    out.insert(out.end(), chunk.tokens().begin(), chunk.tokens().end());
    return true;
  }));
  v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  KESTREL_TRY(c.close_session(close));

  v1::GenerateRequest temp;
  *temp.mutable_tokens()->mutable_ids() = prompt.tokens();
  temp.set_max_tokens(6);
  temp.set_ignore_eos(true);
  temp.set_n_ctx(256);
  temp.mutable_sampling()->set_temperature(0.0f);
  KESTREL_TRY(c.generate(temp, [&](const v1::GenerateChunk& chunk) {
    out.insert(out.end(), chunk.tokens().begin(), chunk.tokens().end());
    return true;
  }));
  return out;
}

std::string status_name(const Error& e) {
  const auto colon = e.message.find(':');
  return colon == std::string::npos ? e.message : e.message.substr(0, colon);
}

}  // namespace kestrel::itest
