// Bus messages: cereal-serialized structs inside a framed, versioned, checksummed
// envelope, decoded with every length bounded before anything is allocated.
//
// The frame (header, checksum, decode_frame) is frame.hpp; unpack() reads a payload with
// BoundedInputArchive (bounded_archive.hpp), and a payload must be consumed exactly.
// Per-token versions as runs are token_versions.hpp, a mixture-of-experts sample's routing
// token_routing.hpp.
//
//   std::string wire = rlx::bus::pack(rlx::bus::Heartbeat{.who = "worker-3"}, /*seq=*/7);
//   auto frame = rlx::bus::decode_frame(wire, limits);      // throws FrameError
//   auto hb = rlx::bus::unpack<rlx::bus::Heartbeat>(frame, limits);
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <ostream>
#include <span>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlx/bus/bounded_archive.hpp"
#include "rlx/bus/frame.hpp"
#include "rlx/bus/token_routing.hpp"
#include "rlx/bus/token_versions.hpp"
#include "rlx/core/error.hpp"

namespace rlx::bus {

// --- messages ----------------------------------------------------------------------------

// A worker or learner introduces itself; `incarnation` changes on every restart.
struct Hello {
  static constexpr MsgType kType = MsgType::hello;
  std::string who;
  std::string role;  // "worker" or "learner"
  uint64_t incarnation = 0;
  template <class Ar> void serialize(Ar& ar) { ar(who, role, incarnation); }
};

// The hub's answer to Hello: credits to send trajectory groups with, and settings.
// `rehello`: the hub does not know the sender (it restarted, or declared the sender lost);
// the sender must say Hello again and resend what was not acknowledged.
struct Welcome {
  static constexpr MsgType kType = MsgType::welcome;
  uint64_t credits = 0;
  double heartbeat_s = 1.0;
  double lease_timeout_s = 60.0;
  bool rehello = false;
  template <class Ar> void serialize(Ar& ar) { ar(credits, heartbeat_s, lease_timeout_s, rehello); }
};

struct LeaseRequest {
  static constexpr MsgType kType = MsgType::lease_request;
  uint32_t max_leases = 1;
  template <class Ar> void serialize(Ar& ar) { ar(max_leases); }
};

// One prompt group to generate: the task (JSON text from the dataset), its group size,
// and the oldest weight version the hub will accept for it.
struct Lease {
  uint64_t lease_id = 0;
  uint64_t prompt_index = 0;  // position in the dataset
  uint64_t epoch = 0;
  uint32_t group_size = 1;
  int64_t min_version = 0;
  uint32_t attempt = 0;       // 0 first time; incremented on every re-issue
  std::string task;           // the dataset record (JSON)
  template <class Ar> void serialize(Ar& ar) { ar(lease_id, prompt_index, epoch, group_size, min_version, attempt, task); }
  bool operator==(const Lease&) const = default;
};

struct LeaseGrant {
  static constexpr MsgType kType = MsgType::lease_grant;
  std::vector<Lease> leases;  // empty: nothing to hand out now (retry later)
  bool exhausted = false;     // the prompt source is finished (a run's last epoch)
  template <class Ar> void serialize(Ar& ar) { ar(leases, exhausted); }
};

// One sample of a group: exact tokens, what the loss sees, behaviour log-probs, reward.
struct Trajectory {
  std::vector<int32_t> tokens;      // prompt + completion (+ environment turns)
  std::vector<uint8_t> loss_mask;   // per token: 1 where the policy produced it
  std::vector<float> logprobs;      // per token: behaviour log-prob (0 where mask is 0)
  TokenVersions versions;           // per token: weight version (-1 where mask is 0), as runs
  int32_t prompt_len = 0;
  float reward = 0;
  std::string finish;               // "stop", "length", "abort", ...
  std::string metadata;             // environment info (JSON)
  TokenRouting routing;             // mixture-of-experts: per token, the experts the sampler's router chose
  template <class Ar> void save(Ar& ar) const {
    ar(tokens, loss_mask, logprobs, versions.run_values(), versions.run_lengths(), prompt_len, reward, finish, metadata,
       routing.layers, routing.top_k, routing.experts);
  }
  template <class Ar> void load(Ar& ar) {
    std::vector<int64_t> run_values;
    std::vector<uint32_t> run_lengths;
    ar(tokens, loss_mask, logprobs, run_values, run_lengths, prompt_len, reward, finish, metadata, routing.layers,
       routing.top_k, routing.experts);
    versions = TokenVersions::from(VersionRuns::checked({reinterpret_cast<const char*>(run_values.data()), run_values.size()},
                                                        {reinterpret_cast<const char*>(run_lengths.data()), run_lengths.size()},
                                                        tokens.size()));
    RoutingView::checked(routing.layers, routing.top_k, RoutingView::of(routing).experts, tokens.size());
  }
  bool operator==(const Trajectory&) const = default;
};

struct TrajectoryGroup {
  static constexpr MsgType kType = MsgType::trajectory_group;
  uint64_t lease_id = 0;
  uint64_t prompt_index = 0;
  uint64_t epoch = 0;
  std::string worker;
  std::vector<Trajectory> samples;
  template <class Ar> void serialize(Ar& ar) { ar(lease_id, prompt_index, epoch, worker, samples); }
  bool operator==(const TrajectoryGroup&) const = default;
  // Smallest and largest weight version over the generated tokens (-1, -1 if none).
  std::pair<int64_t, int64_t> version_range() const;
  int64_t num_tokens() const;
};

// The hub's receipt for the sender's frame `seq`, and the credits the sender holds once
// that frame is processed (trajectory groups it may send without an ack). The hub also
// sends an Ack for the last processed seq when it grants credits later (a top-up).
struct Ack {
  static constexpr MsgType kType = MsgType::ack;
  uint64_t seq = 0;
  uint64_t credits = 0;
  bool duplicate = false;  // the lease had already ended; nothing was added
  std::string verdict;     // for a group: accepted, stale, filtered, duplicate, full, unknown_lease
  template <class Ar> void serialize(Ar& ar) { ar(seq, credits, duplicate, verdict); }
};

struct Heartbeat {
  static constexpr MsgType kType = MsgType::heartbeat;
  std::string who;
  template <class Ar> void serialize(Ar& ar) { ar(who); }
};

// A peer that closes says so (Client::close): the hub counts it gone at once, and re-issues
// a worker's open leases then, instead of after peer_timeout_s without heartbeats. The hub
// acknowledges it ("left"; "unknown" from a peer it did not know).
struct Bye {
  static constexpr MsgType kType = MsgType::bye;
  std::string who;
  template <class Ar> void serialize(Ar& ar) { ar(who); }
};

// A lease that ended without a trajectory group, and why.
struct ErrorRecord {
  static constexpr MsgType kType = MsgType::error_record;
  uint64_t lease_id = 0;
  std::string kind;    // "infra" (worker died, timeout; retried) or "data" (the task itself failed; not retried)
  std::string reason;
  template <class Ar> void serialize(Ar& ar) { ar(lease_id, kind, reason); }
  bool operator==(const ErrorRecord&) const = default;
};

struct Stats {
  static constexpr MsgType kType = MsgType::stats;
  std::vector<std::pair<std::string, double>> values;
  template <class Ar> void serialize(Ar& ar) { ar(values); }
};

// A learner asks for the next batch: `max_groups` groups (0: no limit) and at most
// `max_tokens` tokens (0: no limit). The learner splits a batch across its ranks itself.
// `ack_batch_id` confirms the batches trained: until then the hub keeps a batch and sends
// it again to this learner if the request's `have_batch_id` says it never arrived (a
// reconnect), or returns it to the buffer if the learner restarts (a new incarnation), so
// no batch is lost or trained twice. A learner holds at most two unconfirmed batches: the
// one it trains and the one it asked for ahead (ClientOptions::prefetch_batches), which
// holds only groups that will still be within max_staleness of `train_version`.
// The hub answers when it has `max_groups` groups (or `max_tokens` tokens), or when the
// run's data is finished (Batch::end).
struct BatchRequest {
  static constexpr MsgType kType = MsgType::batch_request;
  uint32_t max_groups = 0;
  uint64_t max_tokens = 0;
  uint64_t ack_batch_id = 0;   // the newest batch trained: it and older ones are confirmed
  uint64_t have_batch_id = 0;  // the newest batch received (>= ack_batch_id; newer ones are sent again)
  // The weight version the batch will be trained with, when later than the hub's (a batch
  // asked for ahead): only groups within max_staleness of it are picked (-1: the hub's).
  int64_t train_version = -1;
  template <class Ar> void serialize(Ar& ar) {
    ar(max_groups, max_tokens, ack_batch_id, have_batch_id, train_version);
  }
};

// The groups a learner trains next. On the wire a batch is a multipart message: a
// BatchHead frame, then the frame of each group exactly as its worker sent it (the hub
// forwards them without a copy, and the learner checks each worker's checksum).
struct Batch {
  uint64_t batch_id = 0;
  std::vector<TrajectoryGroup> groups;
  bool end = false;  // every lease has ended and the buffer is drained
  template <class Ar> void serialize(Ar& ar) { ar(batch_id, groups, end); }
  bool operator==(const Batch&) const = default;
};

// The first part of a batch message; `groups` trajectory_group frames follow it.
struct BatchHead {
  static constexpr MsgType kType = MsgType::batch;
  uint64_t batch_id = 0;
  bool end = false;
  uint64_t groups = 0;
  template <class Ar> void serialize(Ar& ar) { ar(batch_id, end, groups); }
};
// A batch has at most this many groups (a learner asks for tens to thousands).
inline constexpr uint64_t kMaxBatchGroups = uint64_t{1} << 16;

// A learner published new weights: groups older than the staleness bound are evicted.
struct VersionUpdate {
  static constexpr MsgType kType = MsgType::version_update;
  int64_t version = 0;
  template <class Ar> void serialize(Ar& ar) { ar(version); }
};

// Commands and ops travel as one byte each; a value outside 1..last is a malformed frame.
namespace detail {
template <class E>
E enum_from_wire(uint8_t value, E last, std::string_view what) {
  if (value < 1 || value > static_cast<uint8_t>(last))
    throw FrameError(Reject::malformed, "unknown " + std::string(what) + " " + std::to_string(value) + " (1 to " +
                                            std::to_string(static_cast<uint8_t>(last)) + ")");
  return static_cast<E>(value);
}
}  // namespace detail

// A request to the hub: save its state to its state file now, or save it and stop.
enum class ControlCommand : uint8_t { save = 1, stop = 2 };
inline constexpr ControlCommand kLastControlCommand = ControlCommand::stop;
std::string_view to_string(ControlCommand c);
struct Control {
  static constexpr MsgType kType = MsgType::control;
  ControlCommand command = ControlCommand::save;
  template <class Ar> void save(Ar& ar) const { ar(static_cast<uint8_t>(command)); }
  template <class Ar> void load(Ar& ar) {
    uint8_t c = 0;
    ar(c);
    command = detail::enum_from_wire(c, kLastControlCommand, "control command");
  }
};

// A learner checkpointed after training batch `batch_id` (0: none yet), which is therefore
// confirmed; the hub saves its state beside its state file as `name`, and a resume from
// that checkpoint restores the hub from it. Only a learner sends it.
struct CheckpointSaved {
  static constexpr MsgType kType = MsgType::checkpoint_saved;
  std::string name;  // a plain file name: letters, digits, _ . - (at most 128, not starting with '.')
  uint64_t batch_id = 0;
  template <class Ar> void serialize(Ar& ar) { ar(name, batch_id); }
};

// A rollout worker's call on an environment server: reset (payload: the task JSON), step
// (action), load (payload: a saved state, to continue an episode on a restarted server) or
// close. `turn` numbers the calls of an episode: the server answers a repeated (episode,
// turn) from its cache, so a retried step is never applied twice.
enum class EnvOp : uint8_t { reset = 1, step = 2, load = 3, close = 4 };
inline constexpr EnvOp kLastEnvOp = EnvOp::close;
std::string_view to_string(EnvOp op);
struct EnvRequest {
  static constexpr MsgType kType = MsgType::env_request;
  uint64_t episode = 0;
  uint64_t turn = 0;
  EnvOp op = EnvOp::reset;
  std::string env;      // environment name (reset, load)
  std::string payload;  // task or state JSON
  std::vector<int32_t> action;
  template <class Ar> void save(Ar& ar) const { ar(episode, turn, static_cast<uint8_t>(op), env, payload, action); }
  template <class Ar> void load(Ar& ar) {
    uint8_t o = 0;
    ar(episode, turn, o, env, payload, action);
    op = detail::enum_from_wire(o, kLastEnvOp, "env op");
  }
};

struct EnvReply {
  static constexpr MsgType kType = MsgType::env_reply;
  uint64_t episode = 0;
  uint64_t turn = 0;
  std::string error;       // empty: ok
  std::string error_kind;  // "data" (the task or action is at fault) or "infra"
  std::vector<int32_t> observation;
  double reward = 0;
  bool done = false;
  std::string info;   // JSON
  std::string state;  // the environment's state after this call (to reload it elsewhere)
  template <class Ar> void serialize(Ar& ar) { ar(episode, turn, error, error_kind, observation, reward, done, info, state); }
};

// --- pack / unpack -------------------------------------------------------------------------

// Fills the header of `frame`, whose payload follows its first kHeaderBytes bytes.
void seal_frame(std::string& frame, MsgType type, uint64_t seq);

namespace detail {
// An ostream buffer appending to a string (cereal writes the payload in place).
class StringAppendBuf : public std::streambuf {
 public:
  explicit StringAppendBuf(std::string& out) : out_(out) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    out_.append(s, static_cast<size_t>(n));
    return n;
  }
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) out_.push_back(static_cast<char>(c));
    return c;
  }

 private:
  std::string& out_;
};

// Counts the bytes cereal would write (pack() sizes its buffer once, no regrowth).
class CountingBuf : public std::streambuf {
 public:
  size_t bytes = 0;

 protected:
  std::streamsize xsputn(const char*, std::streamsize n) override {
    bytes += static_cast<size_t>(n);
    return n;
  }
  int_type overflow(int_type c) override {
    ++bytes;
    return c == traits_type::eof() ? traits_type::not_eof(c) : c;
  }
};
}  // namespace detail

template <class T>
std::string pack(const T& msg, uint64_t seq = 0) {
  detail::CountingBuf counter;
  {
    std::ostream os(&counter);
    cereal::BinaryOutputArchive ar(os);
    ar(msg);
  }
  std::string frame;
  frame.reserve(kHeaderBytes + counter.bytes);
  frame.resize(kHeaderBytes);
  {
    detail::StringAppendBuf buf(frame);
    std::ostream os(&buf);
    cereal::BinaryOutputArchive ar(os);
    ar(msg);
  }
  seal_frame(frame, T::kType, seq);
  return frame;
}

template <class T>
T unpack(const Frame& frame, const Limits& limits) {
  if (frame.type != T::kType)
    throw FrameError(Reject::malformed, "expected a " + std::string(to_string(T::kType)) + " message, got " +
                                            std::string(to_string(frame.type)));
  T msg;
  BoundedInputArchive ar(frame.payload, limits);
  ar(msg);
  if (ar.remaining() != 0)
    throw FrameError(Reject::malformed, std::to_string(ar.remaining()) + " trailing bytes after a " +
                                            std::string(to_string(T::kType)) + " message");
  return msg;
}

// --- trajectory groups read in place ----------------------------------------------------

struct SampleView {
  Unaligned<int32_t> tokens;
  Unaligned<uint8_t> loss_mask;
  Unaligned<float> logprobs;
  VersionRuns versions;
  int32_t prompt_len = 0;
  float reward = 0;
  std::string_view finish, metadata;
  RoutingView routing;
  // Every token id >= 0, every mask 0 or 1, every log-prob finite (arrays of equal length).
  bool tokens_valid() const;
};

// A trajectory group without copying its arrays: either read from a frame's payload
// (parse_group, exactly the bounds and layout unpack<TrajectoryGroup> applies) or laid
// over a TrajectoryGroup's vectors (view_of). The hub validates, stores and forwards
// groups through views; the bytes must outlive the view.
struct GroupView {
  uint64_t lease_id = 0, prompt_index = 0, epoch = 0;
  std::string_view worker;
  std::vector<SampleView> samples;
  // Smallest and largest weight version over the generated tokens (-1, -1 if none).
  std::pair<int64_t, int64_t> version_range() const;
  int64_t num_tokens() const;
};
GroupView parse_group(const Frame& frame, const Limits& limits);  // throws FrameError
GroupView view_of(const TrajectoryGroup& group);
TrajectoryGroup to_group(const GroupView& view);  // copies the arrays out

// A batch whose groups are read in place from the frames that carried them: no copy of
// a token. `frames` are those frames (header included) and `keep` holds their bytes: the
// views stay valid as long as this BatchView (or a copy of `keep`) lives.
struct BatchView {
  uint64_t batch_id = 0;
  std::vector<GroupView> groups;
  bool end = false;
  std::vector<std::string_view> frames;
  std::shared_ptr<const void> keep;
  Batch copy() const;  // the groups copied out (to_group)
};
// Checks each frame (decode_frame: header and checksum; parse_group: its layout) and
// lays the batch over them. A damaged frame is an rlx::Error naming the group and batch.
BatchView read_batch(const BatchHead& head, std::vector<std::string_view> frames, std::shared_ptr<const void> keep,
                     const Limits& limits);
// A batch as one string (its head frame, then its group frames as they came), to hand
// on to another process (a learner's rank 0 broadcasts it to the others), and back: the
// views point into `bytes`. Bad bytes are an rlx::Error that says what was wrong.
std::string pack_batch(const BatchView& batch);
BatchView unpack_batch(std::shared_ptr<const std::string> bytes, const Limits& limits);

// Unpacks the frame as the type its header names and calls f(message). A hub_state frame
// is a file, not a message: FrameError.
template <class F>
void dispatch(const Frame& frame, const Limits& limits, F&& f) {
  switch (frame.type) {
    case MsgType::hello: return f(unpack<Hello>(frame, limits));
    case MsgType::welcome: return f(unpack<Welcome>(frame, limits));
    case MsgType::lease_request: return f(unpack<LeaseRequest>(frame, limits));
    case MsgType::lease_grant: return f(unpack<LeaseGrant>(frame, limits));
    case MsgType::trajectory_group: return f(unpack<TrajectoryGroup>(frame, limits));
    case MsgType::ack: return f(unpack<Ack>(frame, limits));
    case MsgType::heartbeat: return f(unpack<Heartbeat>(frame, limits));
    case MsgType::stats: return f(unpack<Stats>(frame, limits));
    case MsgType::error_record: return f(unpack<ErrorRecord>(frame, limits));
    case MsgType::batch_request: return f(unpack<BatchRequest>(frame, limits));
    case MsgType::batch: return f(unpack<BatchHead>(frame, limits));
    case MsgType::version_update: return f(unpack<VersionUpdate>(frame, limits));
    case MsgType::control: return f(unpack<Control>(frame, limits));
    case MsgType::env_request: return f(unpack<EnvRequest>(frame, limits));
    case MsgType::env_reply: return f(unpack<EnvReply>(frame, limits));
    case MsgType::bye: return f(unpack<Bye>(frame, limits));
    case MsgType::checkpoint_saved: return f(unpack<CheckpointSaved>(frame, limits));
    case MsgType::hub_state: break;
  }
  throw FrameError(Reject::unknown_type, "a " + std::string(to_string(frame.type)) + " frame is not a message");
}

}  // namespace rlx::bus

CEREAL_REGISTER_ARCHIVE(rlx::bus::BoundedInputArchive)
// Payloads are written by cereal's BinaryOutputArchive (BinaryInputArchive already claims
// the output-to-input direction).
namespace cereal::traits::detail {
template <>
struct get_output_from_input<rlx::bus::BoundedInputArchive> {
  using type = cereal::BinaryOutputArchive;
};
}  // namespace cereal::traits::detail
