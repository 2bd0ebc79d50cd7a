// The archive that reads bus payloads (cereal): a vector or string length is checked
// against the bytes that remain (and Limits::max_elements) before the container grows, so a
// peer claiming 2^62 elements costs nothing. message.hpp's unpack() reads with it.
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rlx/bus/frame.hpp"

namespace rlx::bus {

class BoundedInputArchive : public cereal::InputArchive<BoundedInputArchive, cereal::AllowEmptyClassElision> {
 public:
  BoundedInputArchive(std::string_view bytes, const Limits& limits)
      : cereal::InputArchive<BoundedInputArchive, cereal::AllowEmptyClassElision>(this), data_(bytes), limits_(limits) {}

  void read(void* out, size_t n) {
    if (n > remaining())
      throw FrameError(Reject::malformed, "payload ends early: " + std::to_string(n) + " bytes wanted, " +
                                              std::to_string(remaining()) + " left");
    if (n == 0) return;  // an empty container's data() may be null
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
  }
  size_t remaining() const { return data_.size() - pos_; }
  // The next `n` bytes in place (no copy), checked like read().
  const char* take(size_t n) {
    if (n > remaining())
      throw FrameError(Reject::malformed, "payload ends early: " + std::to_string(n) + " bytes wanted, " +
                                              std::to_string(remaining()) + " left");
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  // A container of `n` elements, each at least `min_wire_bytes` on the wire, may follow.
  void check_length(uint64_t n, size_t min_wire_bytes, std::string_view what) const {
    if (n > limits_.max_elements || n > remaining() / std::max<size_t>(1, min_wire_bytes))
      throw FrameError(Reject::malformed, std::string(what) + " claims " + std::to_string(n) + " elements, " +
                                              std::to_string(remaining()) + " payload bytes remain (limit " +
                                              std::to_string(limits_.max_elements) + " elements)");
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  const Limits& limits_;
};

// Primitive loads of the archive.
template <class T>
  requires std::is_arithmetic_v<T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, T& t) {
  ar.read(&t, sizeof(T));
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::SizeTag<T>& t) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  t.size = static_cast<std::remove_reference_t<T>>(n);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::BinaryData<T>& b) {
  ar.read(b.data, static_cast<size_t>(b.size));
}
// Containers: the length is checked before the container grows.
template <class T, class A>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, std::vector<T, A>& v) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    ar.check_length(n, sizeof(T), "a vector");
    v.resize(static_cast<size_t>(n));
    ar.read(v.data(), static_cast<size_t>(n) * sizeof(T));
  } else {
    ar.check_length(n, 1, "a vector");
    v.clear();
    for (uint64_t i = 0; i < n; ++i) ar(v.emplace_back());  // grows only as elements arrive
  }
}
template <class C, class Tr, class A>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, std::basic_string<C, Tr, A>& s) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  ar.check_length(n, sizeof(C), "a string");
  s.resize(static_cast<size_t>(n));
  ar.read(s.data(), static_cast<size_t>(n) * sizeof(C));
}

}  // namespace rlx::bus
