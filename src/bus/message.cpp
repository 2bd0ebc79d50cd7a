#include "rlx/bus/message.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <limits>

#include "rlx/core/hash.hpp"

namespace rlx::bus {

std::string_view to_string(MsgType t) {
  switch (t) {
    case MsgType::hello: return "hello";
    case MsgType::welcome: return "welcome";
    case MsgType::lease_request: return "lease_request";
    case MsgType::lease_grant: return "lease_grant";
    case MsgType::trajectory_group: return "trajectory_group";
    case MsgType::ack: return "ack";
    case MsgType::heartbeat: return "heartbeat";
    case MsgType::stats: return "stats";
    case MsgType::error_record: return "error_record";
    case MsgType::batch_request: return "batch_request";
    case MsgType::batch: return "batch";
    case MsgType::version_update: return "version_update";
    case MsgType::control: return "control";
    case MsgType::hub_state: return "hub_state";
    case MsgType::env_request: return "env_request";
    case MsgType::env_reply: return "env_reply";
    case MsgType::bye: return "bye";
    case MsgType::checkpoint_saved: return "checkpoint_saved";
  }
  return "unknown";
}

std::string_view to_string(ControlCommand c) {
  switch (c) {
    case ControlCommand::save: return "save";
    case ControlCommand::stop: return "stop";
  }
  return "unknown";
}

std::string_view to_string(EnvOp op) {
  switch (op) {
    case EnvOp::reset: return "reset";
    case EnvOp::step: return "step";
    case EnvOp::load: return "load";
    case EnvOp::close: return "close";
  }
  return "unknown";
}

bool is_known(uint16_t type) { return type >= 1 && type <= static_cast<uint16_t>(kLastMsgType); }

std::string_view to_string(Reject r) {
  switch (r) {
    case Reject::truncated: return "truncated";
    case Reject::bad_magic: return "bad_magic";
    case Reject::bad_version: return "bad_version";
    case Reject::unknown_type: return "unknown_type";
    case Reject::oversize: return "oversize";
    case Reject::length_mismatch: return "length_mismatch";
    case Reject::checksum: return "checksum";
    case Reject::malformed: return "malformed";
  }
  return "?";
}

namespace {
// Fixed little-endian layout (x86 and ARM Linux are little-endian; checked at compile time).
static_assert(std::endian::native == std::endian::little, "rlx's wire format assumes a little-endian host");
template <class T>
void put(std::string& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <class T>
T get(std::string_view in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}
}  // namespace

void seal_frame(std::string& frame, MsgType type, uint64_t seq) {
  RLX_ASSERT(frame.size() >= kHeaderBytes, "frame shorter than its header");
  const size_t n = frame.size() - kHeaderBytes;
  put<uint32_t>(frame, 0, kMagic);
  put<uint16_t>(frame, 4, kProtocolVersion);
  put<uint16_t>(frame, 6, static_cast<uint16_t>(type));
  put<uint32_t>(frame, 8, 0);
  put<uint64_t>(frame, 12, seq);
  put<uint64_t>(frame, 20, n);
  put<uint64_t>(frame, 28, hash64(frame.data() + kHeaderBytes, n, static_cast<uint16_t>(type)));
  put<uint32_t>(frame, 36, 0);
}

std::string encode_frame(MsgType type, uint64_t seq, std::string_view payload) {
  std::string out(kHeaderBytes, '\0');
  out.append(payload);
  seal_frame(out, type, seq);
  return out;
}

Frame decode_frame(std::string_view bytes, const Limits& limits) {
  if (bytes.size() < kHeaderBytes)
    throw FrameError(Reject::truncated, fmt::format("frame of {} bytes is shorter than the {}-byte header", bytes.size(), kHeaderBytes));
  if (get<uint32_t>(bytes, 0) != kMagic)
    throw FrameError(Reject::bad_magic, fmt::format("bad magic {:#010x} (want {:#010x}): not an rlx bus frame",
                                                    get<uint32_t>(bytes, 0), kMagic));
  const auto version = get<uint16_t>(bytes, 4);
  if (version != kProtocolVersion)
    throw FrameError(Reject::bad_version,
                     fmt::format("protocol version {} (this build speaks {})", version, kProtocolVersion));
  const auto type = get<uint16_t>(bytes, 6);
  if (!is_known(type)) throw FrameError(Reject::unknown_type, fmt::format("unknown message type {}", type));
  const auto len = get<uint64_t>(bytes, 20);
  if (len > limits.max_frame_bytes)
    throw FrameError(Reject::oversize, fmt::format("payload of {} bytes exceeds the limit of {}", len, limits.max_frame_bytes));
  if (len != bytes.size() - kHeaderBytes)
    throw FrameError(Reject::length_mismatch,
                     fmt::format("header says {} payload bytes, the frame has {}", len, bytes.size() - kHeaderBytes));
  const auto payload = bytes.substr(kHeaderBytes);
  if (hash64(payload.data(), payload.size(), type) != get<uint64_t>(bytes, 28))
    throw FrameError(Reject::checksum, "payload checksum mismatch");
  return {static_cast<MsgType>(type), get<uint64_t>(bytes, 12), payload};
}

namespace {
// A length-prefixed array, checked exactly as BoundedInputArchive checks a vector.
template <class T>
Unaligned<T> take_array(BoundedInputArchive& ar) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  ar.check_length(n, sizeof(T), "a vector");
  return {ar.take(static_cast<size_t>(n) * sizeof(T)), static_cast<size_t>(n)};
}
std::string_view take_string(BoundedInputArchive& ar) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  ar.check_length(n, 1, "a string");
  return {ar.take(static_cast<size_t>(n)), static_cast<size_t>(n)};
}
template <class T>
Unaligned<T> over(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}
}  // namespace

GroupView parse_group(const Frame& frame, const Limits& limits) {
  if (frame.type != MsgType::trajectory_group)
    throw FrameError(Reject::malformed, "expected a trajectory_group message, got " + std::string(to_string(frame.type)));
  // The layout cereal writes for TrajectoryGroup (see its serialize()).
  BoundedInputArchive ar(frame.payload, limits);
  GroupView g;
  ar(g.lease_id, g.prompt_index, g.epoch);
  g.worker = take_string(ar);
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  ar.check_length(n, 1, "a vector");
  for (uint64_t i = 0; i < n; ++i) {  // grows only as samples arrive (no reserve of a claimed count)
    SampleView& s = g.samples.emplace_back();
    s.tokens = take_array<int32_t>(ar);
    s.loss_mask = take_array<uint8_t>(ar);
    s.logprobs = take_array<float>(ar);
    const auto values = take_array<int64_t>(ar);
    s.versions = VersionRuns::checked(values, take_array<uint32_t>(ar), s.tokens.size());
    ar(s.prompt_len, s.reward);
    s.finish = take_string(ar);
    s.metadata = take_string(ar);
    uint16_t layers = 0, top_k = 0;
    ar(layers, top_k);
    s.routing = RoutingView::checked(layers, top_k, take_array<int16_t>(ar), s.tokens.size());
  }
  if (ar.remaining() != 0)
    throw FrameError(Reject::malformed, std::to_string(ar.remaining()) + " trailing bytes after a trajectory_group message");
  return g;
}

GroupView view_of(const TrajectoryGroup& group) {
  GroupView g{.lease_id = group.lease_id, .prompt_index = group.prompt_index, .epoch = group.epoch, .worker = group.worker};
  g.samples.reserve(group.samples.size());
  for (const auto& s : group.samples)
    g.samples.push_back({over(s.tokens), over(s.loss_mask), over(s.logprobs), s.versions.view(), s.prompt_len, s.reward,
                         s.finish, s.metadata, RoutingView::of(s.routing)});
  return g;
}

TrajectoryGroup to_group(const GroupView& view) {
  TrajectoryGroup g{.lease_id = view.lease_id, .prompt_index = view.prompt_index, .epoch = view.epoch,
                    .worker = std::string(view.worker)};
  g.samples.reserve(view.samples.size());
  for (const auto& s : view.samples) {
    Trajectory& t = g.samples.emplace_back();
    s.tokens.append_to(t.tokens);
    s.loss_mask.append_to(t.loss_mask);
    s.logprobs.append_to(t.logprobs);
    t.versions = TokenVersions::from(s.versions);
    t.prompt_len = s.prompt_len;
    t.reward = s.reward;
    t.finish = s.finish;
    t.metadata = s.metadata;
    t.routing = s.routing.copy();
  }
  return g;
}

Batch BatchView::copy() const {
  Batch b{.batch_id = batch_id, .end = end};
  b.groups.reserve(groups.size());
  for (const auto& g : groups) b.groups.push_back(to_group(g));
  return b;
}

BatchView read_batch(const BatchHead& head, std::vector<std::string_view> frames, std::shared_ptr<const void> keep,
                     const Limits& limits) {
  RLX_CHECK(head.groups == frames.size(), "batch {} names {} groups, and {} group frames came", head.batch_id,
            head.groups, frames.size());
  BatchView b{.batch_id = head.batch_id, .end = head.end};
  b.groups.reserve(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    try {
      b.groups.push_back(parse_group(decode_frame(frames[i], limits), limits));
    } catch (const FrameError& e) {
      throw Error(fmt::format("group {} of batch {} is damaged ({}): {}", i, head.batch_id, to_string(e.reason()), e.what()));
    }
  }
  b.frames = std::move(frames);
  b.keep = std::move(keep);
  return b;
}

std::string pack_batch(const BatchView& batch) {
  std::string out = pack(BatchHead{.batch_id = batch.batch_id, .end = batch.end, .groups = batch.frames.size()});
  for (const auto f : batch.frames) out.append(f);
  return out;
}

BatchView unpack_batch(std::shared_ptr<const std::string> bytes, const Limits& limits) {
  std::string_view rest = *bytes;
  // The next frame of `rest`, as long as its header says (decode_frame checks the rest).
  auto next = [&](std::string_view what) {
    if (rest.size() < kHeaderBytes)
      throw Error(fmt::format("packed batch: {} ends after {} bytes, short of a frame header", what, rest.size()));
    const auto len = get<uint64_t>(rest, 20);
    if (len > rest.size() - kHeaderBytes)
      throw Error(fmt::format("packed batch: {} claims {} payload bytes, {} remain", what, len, rest.size() - kHeaderBytes));
    const auto frame = rest.substr(0, kHeaderBytes + len);
    rest.remove_prefix(frame.size());
    return frame;
  };
  BatchHead head;
  try {
    head = unpack<BatchHead>(decode_frame(next("the head"), limits), limits);
  } catch (const FrameError& e) {
    throw Error(fmt::format("packed batch: damaged head ({}): {}", to_string(e.reason()), e.what()));
  }
  if (head.groups > kMaxBatchGroups)
    throw Error(fmt::format("packed batch: {} groups, more than a batch has ({})", head.groups, kMaxBatchGroups));
  std::vector<std::string_view> frames;
  for (uint64_t i = 0; i < head.groups; ++i) frames.push_back(next(fmt::format("group {}", i)));
  if (!rest.empty()) throw Error(fmt::format("packed batch: {} bytes after its {} groups", rest.size(), head.groups));
  return read_batch(head, std::move(frames), std::move(bytes), limits);
}

// The hub scans every token of every group it receives. These loops are also built for
// AVX-512 and AVX2, and the dynamic loader picks the clone the CPU runs (16 us -> 1.5 us
// for a 16k-token version scan on cpu2; the baseline x86-64 has no 64-bit vector min).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RLX_SCAN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RLX_SCAN_CLONES
#endif

namespace {
// The smallest (as unsigned) and largest version of `n` at `p`. Locals, not references:
// the bytes read could alias an output, which would keep the loop scalar.
RLX_SCAN_CLONES std::pair<uint64_t, int64_t> scan_versions(const char* p, size_t n) {
  // Branch-free: a negative version (no version, outside actions) is above every real one
  // as unsigned (the minimum skips it) and below 0 as signed (the maximum skips it).
  uint64_t lo = std::numeric_limits<uint64_t>::max();
  int64_t hi = -1;
  for (size_t i = 0; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, p + i * sizeof(v), sizeof(v));
    lo = std::min(lo, static_cast<uint64_t>(v));
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

// The first index from `from` whose value is not `value` (or `n`): eight at a time, one
// branch a block (the loop vectorises; a per-value exit would not).
RLX_SCAN_CLONES size_t run_end(const char* p, size_t from, size_t n, int64_t value) {
  size_t i = from;
  for (; i + 8 <= n; i += 8) {
    uint64_t differ = 0;
    for (size_t k = 0; k < 8; ++k) {
      int64_t v;
      std::memcpy(&v, p + (i + k) * sizeof(v), sizeof(v));
      differ |= static_cast<uint64_t>(v ^ value);
    }
    if (differ) break;
  }
  for (; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, p + i * sizeof(v), sizeof(v));
    if (v != value) break;
  }
  return i;
}

RLX_SCAN_CLONES bool scan_tokens(const char* tokens, const char* mask, const char* logprobs, size_t n) {
  unsigned bad = 0;
  for (size_t t = 0; t < n; ++t) {
    int32_t id;
    uint8_t m;
    float lp;
    std::memcpy(&id, tokens + t * sizeof(id), sizeof(id));
    std::memcpy(&m, mask + t, 1);
    std::memcpy(&lp, logprobs + t * sizeof(lp), sizeof(lp));
    bad |= static_cast<unsigned>(id < 0) | static_cast<unsigned>(m > 1) |
           static_cast<unsigned>(!(std::fabs(lp) <= std::numeric_limits<float>::max()));
  }
  return bad == 0;
}
}  // namespace

VersionRuns VersionRuns::checked(Unaligned<int64_t> values, Unaligned<uint32_t> lengths, size_t tokens) {
  if (values.size() != lengths.size())
    throw FrameError(Reject::malformed, fmt::format("versions: {} run values and {} run lengths", values.size(), lengths.size()));
  uint64_t covered = 0;  // at most 2^32 a run, and fewer runs than payload bytes: no overflow
  for (size_t r = 0; r < lengths.size(); ++r) {
    const uint32_t n = lengths[r];
    if (n == 0) throw FrameError(Reject::malformed, fmt::format("versions: run {} has no tokens", r));
    covered += n;
  }
  if (covered != tokens)
    throw FrameError(Reject::malformed, fmt::format("versions: {} runs cover {} tokens, the sample has {}", values.size(), covered, tokens));
  return {values, lengths, tokens};
}

void VersionRuns::append_to(std::vector<int64_t>& out) const {
  const size_t at = out.size();
  out.resize(at + tokens);
  auto* p = out.data() + at;
  for (size_t r = 0; r < values.size(); ++r) p = std::fill_n(p, lengths[r], values[r]);
}

namespace {
// Appends `n` tokens of `value`, joined to the last run when it has the same value and
// `join` allows it; a run longer than 2^32 - 1 tokens is split.
void add_run(std::vector<int64_t>& values, std::vector<uint32_t>& lengths, int64_t value, uint64_t n, bool join) {
  constexpr uint64_t kMax = std::numeric_limits<uint32_t>::max();
  if (n > 0 && join && !values.empty() && values.back() == value && lengths.back() < kMax) {
    const uint64_t take = std::min<uint64_t>(n, kMax - lengths.back());
    lengths.back() += static_cast<uint32_t>(take);
    n -= take;
  }
  while (n > 0) {
    const uint64_t take = std::min<uint64_t>(n, kMax);
    values.push_back(value), lengths.push_back(static_cast<uint32_t>(take));
    n -= take;
  }
}
}  // namespace

void append_runs(const VersionRuns& v, std::vector<int64_t>& values, std::vector<uint32_t>& lengths) {
  const size_t first = values.size();
  for (size_t r = 0; r < v.values.size(); ++r) add_run(values, lengths, v.values[r], v.lengths[r], values.size() > first);
}

TokenVersions::TokenVersions(std::span<const int64_t> per_token) {
  const auto* p = reinterpret_cast<const char*>(per_token.data());
  const size_t n = per_token.size();
  for (size_t t = 0; t < n;) {
    const size_t end = run_end(p, t, n, per_token[t]);
    append(per_token[t], end - t);
    t = end;
  }
}

TokenVersions TokenVersions::from(const VersionRuns& runs) {
  TokenVersions v;
  append_runs(runs, v.values_, v.lengths_);
  v.tokens_ = runs.tokens;
  return v;
}

void TokenVersions::append(int64_t version, uint64_t tokens) {
  add_run(values_, lengths_, version, tokens, true);
  tokens_ += tokens;
}

std::vector<int64_t> TokenVersions::per_token() const {
  std::vector<int64_t> out;
  view().append_to(out);
  return out;
}

namespace {
// Whether every value of `n` int16 at `p` is in [-1, kMaxExperts) (branch-free).
RLX_SCAN_CLONES bool scan_experts(const char* p, size_t n) {
  unsigned bad = 0;
  for (size_t i = 0; i < n; ++i) {
    int16_t e;
    std::memcpy(&e, p + i * sizeof(e), sizeof(e));
    bad |= static_cast<unsigned>(e < -1) | static_cast<unsigned>(e >= kMaxExperts);
  }
  return bad == 0;
}
}  // namespace

RoutingView RoutingView::checked(uint16_t layers, uint16_t top_k, Unaligned<int16_t> experts, size_t tokens) {
  const size_t per = static_cast<size_t>(layers) * top_k;
  if (experts.size() == 0 && per == 0) return {layers, top_k, experts};
  if (per == 0)
    throw FrameError(Reject::malformed, fmt::format("routing: {} values for {} sparse layers x top {}", experts.size(),
                                                    layers, top_k));
  if (experts.size() != tokens * per)
    throw FrameError(Reject::malformed, fmt::format("routing: {} values, the sample's {} tokens x {} sparse layers x "
                                                    "top {} make {}",
                                                    experts.size(), tokens, layers, top_k, tokens * per));
  return {layers, top_k, experts};
}

std::optional<std::string> routing_mismatch(const RoutingView& r, size_t tokens) {
  try {
    RoutingView::checked(r.layers, r.top_k, r.experts, tokens);
  } catch (const FrameError& e) {
    return e.what();
  }
  if (scan_experts(r.experts.p, r.experts.size())) return std::nullopt;
  size_t i = 0;
  while (i < r.experts.size() && r.experts[i] >= -1 && r.experts[i] < kMaxExperts) ++i;
  return fmt::format("routing: token {} layer {} names expert {} (experts are -1, none recorded, or 0 to {})",
                     i / r.per_token(), i / r.top_k % r.layers, r.experts[i], kMaxExperts - 1);
}

bool SampleView::tokens_valid() const {
  const size_t n = tokens.size();
  RLX_ASSERT(loss_mask.size() == n && logprobs.size() == n, "tokens_valid: arrays of different lengths");
  return scan_tokens(tokens.p, loss_mask.p, logprobs.p, n);
}

std::pair<int64_t, int64_t> GroupView::version_range() const {
  uint64_t lo = std::numeric_limits<uint64_t>::max();
  int64_t hi = -1;
  for (const auto& s : samples) {
    const auto [l, h] = scan_versions(s.versions.values.p, s.versions.values.size());  // the runs' values
    lo = std::min(lo, l);
    hi = std::max(hi, h);
  }
  return hi < 0 ? std::pair<int64_t, int64_t>{-1, -1} : std::pair{static_cast<int64_t>(lo), hi};
}

int64_t GroupView::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : samples) n += static_cast<int64_t>(s.tokens.size());
  return n;
}

std::pair<int64_t, int64_t> TrajectoryGroup::version_range() const { return view_of(*this).version_range(); }
int64_t TrajectoryGroup::num_tokens() const { return view_of(*this).num_tokens(); }

}  // namespace rlx::bus
