// `rlx bench sync --path broadcast|nccl`: the broadcast weight-sync path (a publisher and N
// subscribers in this process; Gloo as the data plane, or NCCL with the publisher's buffers on
// cuda:0 and subscriber i's on cuda:i+1) against the raw collective moving the same bytes
// between the same number of ranks, in the same run.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "rlx/dist/weight_sync.hpp"

namespace rlx::cli {

// Fields of the bench's JSON line: ms per version of each, GB/s, and their ratio. With `nccl`
// the tensors `w` are on cuda:0 and the machine has subscribers + 1 devices.
nlohmann::json broadcast_versions(std::vector<std::pair<std::string, at::Tensor>>& w, const dist::WeightLayout& layout,
                                  int64_t versions, int subscribers, int64_t bucket_mb, bool nccl = false);

}  // namespace rlx::cli
