// A WeightLayout as JSON, for the paths that send it over a wire (tcp, broadcast):
// {"dtype": code, "tensors": [[name, shape], ...]}, and its 64-bit hash.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "rlx/dist/weight_sync.hpp"

namespace rlx::dist {

nlohmann::json layout_to_json(const WeightLayout& layout);
// The layout `j` describes, within kMaxSyncTensors and kMaxSyncBytes; an rlx::Error saying
// what is wrong otherwise.
WeightLayout layout_from_json(const nlohmann::json& j);
// xxh3 of the layout's JSON text: equal layouts, equal hashes.
uint64_t layout_hash(const WeightLayout& layout);

}  // namespace rlx::dist
