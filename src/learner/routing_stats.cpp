#include "rlx/learner/routing_stats.hpp"

#include <cmath>

#include "rlx/core/error.hpp"

namespace rlx {

void RoutingStats::add(const RoutingTrace& trace, const MicroBatch& mb, bool replayed) {
  const int64_t valid_tokens = trace.valid_tokens();
  if (trace.empty() || valid_tokens == 0) return;
  load += trace.max_over_mean_load();
  entropy += trace.router_entropy();
  aux_loss += trace.aux_loss();
  forwards += 1;
  if (!mb.routing.defined()) return;
  const auto valid = mb.segments.to(at::kCPU) != 0;                                  // [R, T]
  const auto has = (mb.routing.to(at::kCPU).select(-1, 0) >= 0) & valid.unsqueeze(-1);  // [R, T, S]
  const auto layers = static_cast<int64_t>(trace.agree.size());
  RLX_ASSERT(has.size(2) == layers, "routing stats: {} recorded sparse layers, the trace has {}", has.size(2), layers);
  recorded += has.sum().item<double>();
  for (int64_t s = 0; s < layers; ++s) {
    const auto& a = trace.agree[static_cast<size_t>(s)];
    if (replayed) {
      // A replayed row uses the recorded experts and an unrecorded one its own: every row
      // the router disagrees with is a recorded one. agree = agreeing valid rows / valid.
      const auto valid_rows = static_cast<double>(valid_tokens);
      agree += has.select(2, s).sum().item<double>() - std::round((1.0 - a.item<double>()) * valid_rows);
    } else {
      const auto own = std::get<0>(at::sort(trace.experts[static_cast<size_t>(s)].to(at::kCPU), -1));  // [R, T, k]
      const auto rec = std::get<0>(at::sort(mb.routing.to(at::kCPU).select(2, s).to(at::kLong), -1));
      agree += ((own == rec).all(-1) & has.select(2, s)).sum().item<double>();
    }
  }
}

RoutingStats& RoutingStats::operator+=(const RoutingStats& o) {
  agree += o.agree, recorded += o.recorded, load += o.load, entropy += o.entropy, aux_loss += o.aux_loss;
  forwards += o.forwards;
  return *this;
}

RoutingStats RoutingStats::from(const std::vector<double>& v) {
  RLX_ASSERT(v.size() == 6, "RoutingStats::from: {} sums", v.size());
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

void RoutingStats::add_to(std::map<std::string, double>& metrics) const {
  if (forwards <= 0) return;
  if (recorded > 0) metrics["moe/routing_agreement"] = agree / recorded;
  metrics["moe/load_max_over_mean"] = load / forwards;
  metrics["moe/router_entropy"] = entropy / forwards;
  metrics["moe/aux_loss"] = aux_loss / forwards;
}

}  // namespace rlx
