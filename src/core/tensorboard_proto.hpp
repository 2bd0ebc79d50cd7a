// The protobuf side of TensorBoard event files, alone. Its translation units see Debian's
// protobuf headers and nothing of LibTorch's include directory, which on PyTorch 2.x ships
// an older protobuf of its own (and fmt, which is why tensorboard.cpp cannot hold this).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlx::tb_proto {

// One tensorflow.Event: a file version record or a summary of scalar and text values.
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                              // set: a file version record
  std::vector<std::pair<std::string, float>> scalars;    // tag, simple_value
  std::vector<std::pair<std::string, std::string>> texts;  // tag, a scalar string tensor of the text plugin
};

// False in a build without protobuf (RLX_TENSORBOARD=OFF), where the others throw.
bool built();
std::string serialize(const Event& e);
// False when payload is not an Event.
bool parse(std::string_view payload, Event& out);

}  // namespace rlx::tb_proto
