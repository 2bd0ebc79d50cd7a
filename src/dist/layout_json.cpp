#include "dist/layout_json.hpp"

#include "rlx/core/error.hpp"
#include "rlx/core/hash.hpp"

namespace rlx::dist {

using nlohmann::json;

json layout_to_json(const WeightLayout& layout) {
  json tensors = json::array();
  for (const auto& [name, shape] : layout.tensors) tensors.push_back({name, shape});
  return {{"dtype", static_cast<int>(layout.dtype)}, {"tensors", std::move(tensors)}};
}

WeightLayout layout_from_json(const json& j) {
  auto fail = [](const std::string& what) { throw Error("weight layout: " + what); };
  if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_number_integer() || !j.contains("tensors") ||
      !j["tensors"].is_array())
    fail("no dtype or tensors");
  const int code = j["dtype"].get<int>();
  const auto dtype = static_cast<at::ScalarType>(code);
  if (code < 0 || code >= static_cast<int>(at::ScalarType::NumOptions) || !at::isFloatingType(dtype))
    fail(fmt::format("dtype code {} is not a floating-point type", code));
  const auto& ts = j["tensors"];
  if (ts.empty() || ts.size() > static_cast<size_t>(kMaxSyncTensors))
    fail(fmt::format("{} tensors (1 to {})", ts.size(), kMaxSyncTensors));
  WeightLayout l;
  l.dtype = dtype;
  for (const auto& t : ts) {
    if (!t.is_array() || t.size() != 2 || !t[0].is_string() || !t[1].is_array() || t[1].size() > 8)
      fail("a tensor entry is not [name, shape of at most 8 dimensions]");
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& d : t[1]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxSyncBytes)
        fail("a tensor dimension out of range");
      shape.push_back(d.get<int64_t>());
      numel = std::min<int64_t>(numel * std::max<int64_t>(shape.back(), 1), kMaxSyncBytes + 1);
    }
    if (numel > kMaxSyncBytes) fail(fmt::format("tensor {:?} is larger than {} bytes", t[0].get<std::string>(), kMaxSyncBytes));
    l.tensors.emplace_back(t[0].get<std::string>(), std::move(shape));
  }
  if (l.bytes() > kMaxSyncBytes) fail(fmt::format("{} bytes per version exceeds {}", l.bytes(), kMaxSyncBytes));
  return l;
}

uint64_t layout_hash(const WeightLayout& layout) {
  const auto text = layout_to_json(layout).dump();
  return hash64(text.data(), text.size());
}

}  // namespace rlx::dist
