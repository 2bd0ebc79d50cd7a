// Arrays read in place from a payload (Unaligned), and a sample's per-token weight
// versions held as runs (VersionRuns on the wire, TokenVersions in memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "rlx/bus/frame.hpp"

namespace rlx::bus {

// `n` values of T at `p`, as they lie in a payload (unaligned: each is read with memcpy).
template <class T>
struct Unaligned {
  const char* p = nullptr;
  size_t n = 0;
  size_t size() const { return n; }
  T operator[](size_t i) const {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  }
  void append_to(std::vector<T>& out) const {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n * sizeof(T));
  }
};

// Per-token weight versions as runs: values[r] for lengths[r] tokens in a row. A sample's
// tokens mostly carry one version (a rollout spans a weight update at most a few times), so
// memory, the wire and the trajectory file all hold runs: 12 bytes a run against 8 a token
// (half of a group's bytes when they were per token). This is a view (over a payload, a
// file's columns or a TokenVersions); runs read from a peer or a file are checked first.
struct VersionRuns {
  Unaligned<int64_t> values;
  Unaligned<uint32_t> lengths;
  size_t tokens = 0;  // the lengths' sum
  size_t size() const { return tokens; }
  void append_to(std::vector<int64_t>& out) const;  // a value per token
  // Runs that cover exactly `tokens` tokens, none of them empty; a FrameError (malformed)
  // that says what is wrong otherwise.
  static VersionRuns checked(Unaligned<int64_t> values, Unaligned<uint32_t> lengths, size_t tokens);
};
// Appends the runs of `v` to values/lengths, equal neighbours within `v` joined (the
// shortest form); the runs already there are left as they are (one sample's runs a call).
void append_runs(const VersionRuns& v, std::vector<int64_t>& values, std::vector<uint32_t>& lengths);

// A sample's weight versions, one per token, held as runs in their shortest form (equal
// neighbours joined, a run split only past 2^32 - 1 tokens), so that == compares what each
// token carries. Built a token at a time (push_back), from per-token values, or from runs.
//
//   TokenVersions v(64, -1);     // the prompt: no version
//   v.append(3, 1000);           // 1000 tokens sampled with weights version 3
//   v.push_back(4);              // one with version 4
//   v.size() == 1065, v.runs() == 3
class TokenVersions {
 public:
  TokenVersions() = default;
  TokenVersions(std::initializer_list<int64_t> per_token) : TokenVersions(std::span(per_token.begin(), per_token.size())) {}
  explicit TokenVersions(std::span<const int64_t> per_token);
  TokenVersions(size_t tokens, int64_t value) { append(value, tokens); }
  static TokenVersions from(const VersionRuns& runs);

  void push_back(int64_t version) {
    if (!values_.empty() && values_.back() == version && lengths_.back() < kMaxRun) {
      ++lengths_.back(), ++tokens_;
    } else {
      append(version, 1);
    }
  }
  void append(int64_t version, uint64_t tokens);
  void clear() { values_.clear(), lengths_.clear(), tokens_ = 0; }

  size_t size() const { return tokens_; }  // tokens
  bool empty() const { return tokens_ == 0; }
  size_t runs() const { return values_.size(); }
  const std::vector<int64_t>& run_values() const { return values_; }
  const std::vector<uint32_t>& run_lengths() const { return lengths_; }
  VersionRuns view() const {
    return {{reinterpret_cast<const char*>(values_.data()), values_.size()},
            {reinterpret_cast<const char*>(lengths_.data()), lengths_.size()}, tokens_};
  }
  std::vector<int64_t> per_token() const;
  bool operator==(const TokenVersions&) const = default;

 private:
  static constexpr uint32_t kMaxRun = std::numeric_limits<uint32_t>::max();
  std::vector<int64_t> values_;
  std::vector<uint32_t> lengths_;
  size_t tokens_ = 0;
};

}  // namespace rlx::bus
