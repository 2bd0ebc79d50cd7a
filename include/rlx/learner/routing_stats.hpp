// A mixture-of-experts learner's routing statistics: how often its router agrees with the
// rollout's recorded routing, expert load, router entropy and the load-balancing loss,
// summed over micro-batches, ranks and optimizer steps, reported as the step's `moe/` metrics.
//
//   rlx::RoutingStats stats;
//   stats.add(trace, mb, /*replayed=*/true);   // after each micro-batch's forward
//   stats.add_to(metrics);                     // moe/routing_agreement, moe/load_max_over_mean, ...
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rlx/learner/batching.hpp"
#include "rlx/model/moe.hpp"

namespace rlx {

struct RoutingStats {
  double agree = 0;        // (token, sparse layer) rows with a recorded routing that the router's own top-k matches
  double recorded = 0;     // (token, sparse layer) rows with a recorded routing
  double load = 0;         // sum over forwards of the most-loaded expert over the mean (RoutingTrace::max_over_mean_load)
  double entropy = 0;      // sum over forwards of the mean router entropy (nats)
  double aux_loss = 0;     // sum over forwards of HF's load-balancing loss (RoutingTrace::aux_loss)
  double forwards = 0;     // forwards with tokens

  // One forward of `mb` that filled `trace`; `replayed`: its input carried mb.routing (the
  // trace's experts are then the recorded ones, its own choice seen through trace.agree).
  void add(const RoutingTrace& trace, const MicroBatch& mb, bool replayed);
  RoutingStats& operator+=(const RoutingStats& o);
  // As a vector to sum over ranks, and back.
  std::vector<double> sums() const { return {agree, recorded, load, entropy, aux_loss, forwards}; }
  static RoutingStats from(const std::vector<double>& sums);
  // moe/routing_agreement (when any routing was recorded), moe/load_max_over_mean,
  // moe/router_entropy, moe/aux_loss: means over forwards (nothing without any).
  void add_to(std::map<std::string, double>& metrics) const;
};

}  // namespace rlx
