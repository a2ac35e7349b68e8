// The routing calibration prompt (routing_calibration.h).
#include "cpu/routing_calibration.h"

#include <memory>
#include <string>

#include "cpu/cpu_engine.h"

namespace kestrel::cpu {

std::string_view calibration_text() {
  return "The river was high that spring, and the ferry ran only in the mornings. Mara counted the crates twice "
         "before she signed the manifest: forty-two of apples, seventeen of tools, and one long box nobody could "
         "explain.\n\n"
         "def merge(a, b):\n"
         "    out = []\n"
         "    while a and b:\n"
         "        out.append(a.pop(0) if a[0] <= b[0] else b.pop(0))\n"
         "    return out + a + b\n\n"
         "Q: Why does the sky look blue at noon but red at sunset?\n"
         "A: Air scatters short wavelengths more strongly than long ones. At noon sunlight crosses a thin layer of "
         "air, so scattered blue reaches us from every direction; at sunset the path is long enough that most blue "
         "is scattered away before it arrives, leaving red and orange.\n\n"
         "Meeting notes, 14 March: revenue grew 12.5% quarter over quarter; the Berlin office opens in June; "
         "action items - Priya to draft the hiring plan, Tom to review the 2024 budget by Friday.\n\n"
         "\"Are you sure this is the right road?\" he asked. \"No,\" she said, folding the map, \"but it is the only "
         "one that goes uphill, and the house was on a hill.\"\n\n"
         "SELECT name, COUNT(*) AS orders FROM customers JOIN orders USING (customer_id) GROUP BY name ORDER BY "
         "orders DESC LIMIT 10;\n\n"
         "Photosynthesis turns carbon dioxide and water into glucose and oxygen, powered by light absorbed in "
         "chlorophyll. La lumière du matin entrait par la fenêtre. 東京は日本の首都です。 The integral of 1/x is "
         "ln|x| + C, and e^(i*pi) + 1 = 0.\n\n";
}

Expected<std::vector<int32_t>> calibration_tokens(const Model& model, int32_t n_tokens) {
  if (n_tokens < 1) {
    return make_error(ErrorCode::kInvalidArgument, "routing calibration: the prompt needs at least one token (asked " +
                                                       std::to_string(n_tokens) + ")");
  }
  const std::vector<int32_t> once = model.tokenizer().encode(calibration_text(), false);
  if (once.empty()) return make_error(ErrorCode::kInvalidArgument, "routing calibration: the text has no tokens");
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n_tokens));
  while (out.size() < static_cast<size_t>(n_tokens)) {
    for (int32_t id : once) {
      if (out.size() == static_cast<size_t>(n_tokens)) break;
      if (id < 0 || static_cast<uint32_t>(id) >= model.hparams().n_vocab) {
        return make_error(ErrorCode::kInvalidArgument, "routing calibration: token " + std::to_string(id) +
                                                           " is outside the model's vocabulary of " +
                                                           std::to_string(model.hparams().n_vocab));
      }
      out.push_back(id);
    }
  }
  return out;
}

Expected<RoutingCounts> calibrate_routing(const Model& model, const std::vector<int32_t>& tokens, int32_t threads) {
  if (model.hparams().n_expert == 0) {
    return make_error(ErrorCode::kFailedPrecondition, "routing calibration: the model has no routed experts");
  }
  CpuEngineOptions o;
  o.max_slots = 1;
  o.threads = threads;
  o.max_ctx = static_cast<int32_t>(tokens.size());
  o.populate = false;  // the prompt touches each page about once: mapping them all first only adds time
  o.count_routing = true;
  KESTREL_TRY_ASSIGN(std::unique_ptr<CpuEngine> engine, make_cpu_engine(model, o));
  KESTREL_TRY_ASSIGN(const SlotId slot, engine->slot_alloc(static_cast<int32_t>(tokens.size())));
  EngineStepItem item;
  item.slot = slot;
  item.tokens = tokens;
  item.argmax_only = true;
  EngineStepOutput out;
  engine->step(std::span<const EngineStepItem>(&item, 1), std::span<EngineStepOutput>(&out, 1));
  KESTREL_TRY(out.status);
  RoutingCounts c;
  c.counts = engine->routing_counts();
  c.tokens = static_cast<int64_t>(tokens.size());
  return c;
}

}  // namespace kestrel::cpu
