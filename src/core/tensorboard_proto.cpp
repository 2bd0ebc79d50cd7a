// See tensorboard_proto.hpp.
#include "tensorboard_proto.hpp"

#include <stdexcept>

#if RLX_WITH_TENSORBOARD
#include "tensorboard.pb.h"
#endif

namespace rlx::tb_proto {

#if !RLX_WITH_TENSORBOARD
bool built() { return false; }
std::string serialize(const Event&) { throw std::runtime_error("rlx was built without TensorBoard (RLX_TENSORBOARD=OFF)"); }
bool parse(std::string_view, Event&) { throw std::runtime_error("rlx was built without TensorBoard (RLX_TENSORBOARD=OFF)"); }
#else
bool built() { return true; }

std::string serialize(const Event& e) {
  tensorboard::Event pe;
  pe.set_wall_time(e.wall_time);
  pe.set_step(e.step);
  if (!e.file_version.empty()) {
    pe.set_file_version(e.file_version);
  } else {
    auto* summary = pe.mutable_summary();
    for (const auto& [tag, v] : e.scalars) {
      auto* value = summary->add_value();
      value->set_tag(tag);
      value->set_simple_value(v);
    }
  }
  return pe.SerializeAsString();
}

bool parse(std::string_view payload, Event& out) {
  tensorboard::Event pe;
  if (!pe.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return false;
  out.wall_time = pe.wall_time();
  out.step = pe.step();
  out.file_version = pe.file_version();
  out.scalars.clear();
  if (pe.has_summary())
    for (const auto& v : pe.summary().value()) out.scalars.emplace_back(v.tag(), v.simple_value());
  return true;
}
#endif

}  // namespace rlx::tb_proto
