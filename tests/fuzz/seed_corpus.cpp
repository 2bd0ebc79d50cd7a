// Writes one valid frame of each message type into DIR: the fuzzer's seed corpus.
#include <fstream>

#include "rlx/bus/message.hpp"

using namespace rlx::bus;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  Trajectory t{.tokens = {1, 2, 3}, .loss_mask = {0, 1, 1}, .logprobs = {0, -1, -2}, .versions = {-1, 0, 0}, .prompt_len = 1,
               .reward = 1, .finish = "stop", .metadata = "{}"};
  Trajectory routed = t;  // a mixture-of-experts sample: 2 sparse layers, top 1
  routed.routing = {.layers = 2, .top_k = 1, .experts = {3, 1, 0, 7, -1, -1}};
  TrajectoryGroup g{.lease_id = 1, .prompt_index = 2, .epoch = 0, .worker = "w", .samples = {t, routed}};
  const std::pair<const char*, std::string> frames[] = {
      {"hello", pack(Hello{"w", "worker", 1})},
      {"welcome", pack(Welcome{4, 1.0, 30.0})},
      {"lease_request", pack(LeaseRequest{2})},
      {"lease_grant", pack(LeaseGrant{{Lease{.lease_id = 1, .task = "{}"}}, false})},
      {"group", pack(g, 3)},
      {"ack", pack(Ack{3, 4, false})},
      {"heartbeat", pack(Heartbeat{"w"})},
      {"stats", pack(Stats{{{"x", 1.0}}})},
      {"error", pack(ErrorRecord{1, "infra", "timeout"})},
      {"batch_request", pack(BatchRequest{4, 0})},
      {"batch", pack(BatchHead{.batch_id = 1, .groups = 1})},
      {"version", pack(VersionUpdate{3})},
      {"control", pack(Control{ControlCommand::save})},
      {"checkpoint_saved", pack(CheckpointSaved{.name = "hub-step_00000004.state", .batch_id = 3})},
  };
  const std::string group_frame = pack(g, 3);
  const auto batch = read_batch(BatchHead{.batch_id = 1, .groups = 2}, {group_frame, group_frame}, nullptr, Limits{});
  std::ofstream(dir + "/packed_batch", std::ios::binary) << pack_batch(batch);
  for (const auto& [name, bytes] : frames) std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  return 0;
}
