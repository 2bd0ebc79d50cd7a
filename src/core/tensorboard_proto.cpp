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

constexpr int kDtString = 7;          // TensorFlow's DataType DT_STRING
constexpr int kDataClassTensor = 2;   // TensorFlow's DataClass DATA_CLASS_TENSOR

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
    for (const auto& [tag, text] : e.texts) {
      auto* value = summary->add_value();
      value->set_tag(tag);
      auto* meta = value->mutable_metadata();
      meta->mutable_plugin_data()->set_plugin_name("text");
      meta->set_data_class(kDataClassTensor);
      auto* tensor = value->mutable_tensor();
      tensor->set_dtype(kDtString);
      tensor->mutable_tensor_shape();  // no dims: a scalar
      tensor->add_string_val(text);
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
  out.texts.clear();
  if (pe.has_summary())
    for (const auto& v : pe.summary().value()) {
      if (v.value_case() == tensorboard::SummaryValue::kSimpleValue) out.scalars.emplace_back(v.tag(), v.simple_value());
      const bool text = v.has_metadata() && v.metadata().plugin_data().plugin_name() == "text";
      if (text && v.has_tensor() && v.tensor().dtype() == kDtString && v.tensor().string_val_size() == 1)
        out.texts.emplace_back(v.tag(), v.tensor().string_val(0));
    }
  return true;
}
#endif

}  // namespace rlx::tb_proto
