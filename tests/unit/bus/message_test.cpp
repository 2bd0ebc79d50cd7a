#include "rlx/bus/message.hpp"

#include <optional>

#include "../helpers.hpp"
#include "rlx/core/rng.hpp"

using Catch::Matchers::Contains;
using namespace rlx::bus;

namespace {
TrajectoryGroup sample_group() {
  TrajectoryGroup g{.lease_id = 42, .prompt_index = 7, .epoch = 1, .worker = "w0"};
  for (int s = 0; s < 3; ++s) {
    Trajectory t{.tokens = {1, 2, 3, 4, 5}, .loss_mask = {0, 0, 1, 1, 1}, .logprobs = {0, 0, -0.5f, -1.25f, -2},
                 .versions = {-1, -1, 3, 3, 4}, .prompt_len = 2, .reward = 0.5f * s, .finish = "stop",
                 .metadata = R"({"turns": 1})"};
    // A mixture-of-experts sample's routing (2 sparse layers, top 1); sample 0 has none.
    if (s > 0) t.routing = {.layers = 2, .top_k = 1, .experts = {3, 0, 1, 7, 2, 2, 5, 6, -1, -1}};
    g.samples.push_back(t);
  }
  return g;
}

Reject reason_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const FrameError& e) {
    return e.reason();
  }
  FAIL("no FrameError");
  return Reject::malformed;
}

// A frame with a valid header around an arbitrary payload.
std::string frame_with_payload(MsgType t, const std::string& payload) { return encode_frame(t, 1, payload); }

template <class T>
std::string raw(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
}
}  // namespace

TEST_CASE("bus messages: a group's version range skips tokens without a version", "[bus]") {
  TrajectoryGroup g;
  g.samples.resize(2);
  CHECK(g.version_range() == std::pair<int64_t, int64_t>{-1, -1});  // no tokens
  g.samples[0].versions = {-1, -1, 7, 9, -1};
  g.samples[1].versions = {-1, 12, 8};
  CHECK(g.version_range() == std::pair<int64_t, int64_t>{7, 12});
  g.samples[1].versions = {-1, 0, -3};
  CHECK(g.version_range() == std::pair<int64_t, int64_t>{0, 9});
  for (auto& s : g.samples) s.versions = TokenVersions(1000, -1);
  CHECK(g.version_range() == std::pair<int64_t, int64_t>{-1, -1});  // prompts and observations only
}

TEST_CASE("bus messages: weight versions travel as runs, checked against the tokens", "[bus]") {
  const Limits limits;
  Trajectory t;
  t.tokens.assign(2048, 5), t.loss_mask.assign(2048, 1), t.logprobs.assign(2048, -1.0f);
  t.versions = TokenVersions(64, -1), t.versions.append(3, 900), t.versions.append(4, 1084);  // prompt, then two versions
  TrajectoryGroup g{.lease_id = 1, .samples = {t, t}};
  const std::string wire = pack(g);
  CHECK(wire.size() < 2 * 2048 * 9 + 400);  // tokens, masks, log-probs; three runs a sample, not 8 bytes a token
  CHECK(unpack<TrajectoryGroup>(decode_frame(wire, limits), limits) == g);
  const GroupView view = parse_group(decode_frame(wire, limits), limits);
  CHECK(view.samples[1].versions.values.size() == 3);
  CHECK(view.samples[1].versions.size() == 2048);
  CHECK(view.version_range() == std::pair<int64_t, int64_t>{3, 4});
  CHECK(to_group(view) == g);

  // The shortest form: equal neighbours joined, from a value per token or from runs, and
  // a run longer than a uint32 split.
  std::vector<int64_t> per_token(64, -1);
  per_token.resize(964, 3), per_token.resize(2048, 4);
  CHECK(TokenVersions(per_token) == t.versions);
  CHECK(t.versions.per_token() == per_token);
  CHECK(t.versions.run_values() == std::vector<int64_t>{-1, 3, 4});
  CHECK(t.versions.run_lengths() == std::vector<uint32_t>{64, 900, 1084});
  TokenVersions pushed;
  for (int64_t v : per_token) pushed.push_back(v);
  CHECK(pushed == t.versions);
  CHECK(TokenVersions{-1, 3, 3, -1}.run_lengths() == std::vector<uint32_t>{1, 2, 1});
  TokenVersions long_run(3, 7);
  long_run.append(7, UINT32_MAX);
  long_run.push_back(7);
  CHECK(long_run.run_lengths() == std::vector<uint32_t>{UINT32_MAX, 4});
  CHECK(long_run.size() == 4 + uint64_t{UINT32_MAX});
  std::vector<int64_t> values{9};
  std::vector<uint32_t> lengths{1};
  append_runs(t.versions.view(), values, lengths);  // joins within a sample, never with the runs before
  CHECK(values == std::vector<int64_t>{9, -1, 3, 4});
  const std::vector<int64_t> v2{3, 3, 4, 7, 7};
  const std::vector<uint32_t> l2{1, 2, 1, UINT32_MAX, 5};
  auto runs = [](const auto& v) { return Unaligned<typename std::decay_t<decltype(v)>::value_type>{reinterpret_cast<const char*>(v.data()), v.size()}; };
  values.clear(), lengths.clear();
  append_runs(VersionRuns::checked(runs(v2), runs(l2), 4 + uint64_t{UINT32_MAX} + 5), values, lengths);
  CHECK(values == std::vector<int64_t>{3, 4, 7, 7});
  CHECK(lengths == std::vector<uint32_t>{3, 1, UINT32_MAX, 5});

  // Runs that do not cover the sample's tokens exactly: a payload built by hand, one sample
  // of one token, read both ways (parse_group for the hub, unpack for everything else).
  const auto sample_with = [&](std::vector<int64_t> vals, std::vector<uint32_t> lens) {
    std::string p = raw<uint64_t>(1) + raw<uint64_t>(2) + raw<uint64_t>(3) + raw<uint64_t>(0) + raw<uint64_t>(1);
    p += raw<uint64_t>(1) + raw<int32_t>(9) + raw<uint64_t>(1) + raw<uint8_t>(1) + raw<uint64_t>(1) + raw<float>(-1);
    p += raw<uint64_t>(vals.size());
    for (auto v : vals) p += raw(v);
    p += raw<uint64_t>(lens.size());
    for (auto l : lens) p += raw(l);
    return p + raw<int32_t>(0) + raw<float>(1) + raw<uint64_t>(0) + raw<uint64_t>(0) + raw<uint16_t>(0) +
           raw<uint16_t>(0) + raw<uint64_t>(0);
  };
  const auto both = [&](const std::string& payload) {
    const std::string framed = encode_frame(MsgType::trajectory_group, 1, payload);
    const Frame f = decode_frame(framed, limits);
    const std::string a = rlx::test::error_of([&] { parse_group(f, limits); });
    CHECK(reason_of([&] { unpack<TrajectoryGroup>(f, limits); }) == Reject::malformed);
    CHECK(rlx::test::error_of([&] { unpack<TrajectoryGroup>(f, limits); }) == a);
    return a;
  };
  CHECK(to_group(parse_group(decode_frame(encode_frame(MsgType::trajectory_group, 1, sample_with({6}, {1})), limits), limits))
            .samples[0]
            .versions == TokenVersions{6});
  CHECK_THAT(both(sample_with({6}, {2})), Contains("versions: 1 runs cover 2 tokens, the sample has 1"));
  CHECK_THAT(both(sample_with({6, 6}, {1, 0})), Contains("versions: run 1 has no tokens"));
  CHECK_THAT(both(sample_with({6}, {})), Contains("versions: 1 run values and 0 run lengths"));
  CHECK_THAT(both(sample_with({}, {})), Contains("versions: 0 runs cover 0 tokens, the sample has 1"));
}

TEST_CASE("bus messages: a sample's expert routing round-trips, read in place or unpacked, and is checked", "[bus][routing]") {
  const Limits limits;
  rlx::RngStream rng(51, 0);
  for (int trial = 0; trial < 20; ++trial) {
    TrajectoryGroup g{.lease_id = static_cast<uint64_t>(trial), .worker = "w"};
    for (int s = 0; s < 1 + trial % 4; ++s) {
      Trajectory t;
      const auto n = static_cast<size_t>(rng.uniform_int(1, 300));
      t.tokens.assign(n, 1), t.loss_mask.assign(n, 0), t.logprobs.assign(n, 0.0f), t.versions = TokenVersions(n, -1);
      if ((trial + s) % 5 != 0) {  // some samples without routing
        t.routing.layers = static_cast<uint16_t>(rng.uniform_int(1, 48));
        t.routing.top_k = static_cast<uint16_t>(rng.uniform_int(1, 8));
        t.routing.experts.resize(n * t.routing.per_token());
        for (auto& e : t.routing.experts) e = static_cast<int16_t>(rng.uniform_int(-1, kMaxExperts - 1));
      }
      g.samples.push_back(std::move(t));
    }
    const std::string wire = pack(g, 1);
    CHECK(unpack<TrajectoryGroup>(decode_frame(wire, limits), limits) == g);
    const GroupView view = parse_group(decode_frame(wire, limits), limits);
    REQUIRE(view.samples.size() == g.samples.size());
    for (size_t s = 0; s < g.samples.size(); ++s) {
      CHECK(view.samples[s].routing.layers == g.samples[s].routing.layers);
      CHECK(view.samples[s].routing.experts.size() == g.samples[s].routing.experts.size());
      CHECK_FALSE(routing_mismatch(view.samples[s].routing, g.samples[s].tokens.size()).has_value());
    }
    CHECK(to_group(view) == g);
    CHECK(to_group(view_of(g)) == g);
  }
  CHECK(TokenRouting{.layers = 2, .top_k = 3, .experts = std::vector<int16_t>(12, 0)}.tokens() == 2);

  // Routing whose length is not tokens x layers x top_k is malformed, both ways.
  TrajectoryGroup g = sample_group();
  g.samples[1].routing.experts.pop_back();
  const std::string framed = pack(g, 1);
  const Frame f = decode_frame(framed, limits);
  const std::string a = rlx::test::error_of([&] { parse_group(f, limits); });
  CHECK_THAT(a, Contains("routing: 9 values, the sample's 5 tokens x 2 sparse layers x top 1 make 10"));
  CHECK(rlx::test::error_of([&] { unpack<TrajectoryGroup>(f, limits); }) == a);
  CHECK(reason_of([&] { parse_group(f, limits); }) == Reject::malformed);
}

TEST_CASE("bus messages: every type round-trips through a frame", "[bus]") {
  const Limits limits;
  auto g = sample_group();
  auto f = decode_frame(pack(g, 9), limits);
  CHECK(f.type == MsgType::trajectory_group);
  CHECK(f.seq == 9);
  CHECK(unpack<TrajectoryGroup>(f, limits) == g);
  CHECK(g.version_range() == std::pair<int64_t, int64_t>{3, 4});
  CHECK(g.num_tokens() == 15);

  LeaseGrant grant{.leases = {{.lease_id = 1, .task = R"({"prompt":"1+1"})"}, {.lease_id = 2, .attempt = 3}}};
  auto got = unpack<LeaseGrant>(decode_frame(pack(grant), limits), limits);
  CHECK((got.leases == grant.leases));
  CHECK(unpack<Hello>(decode_frame(pack(Hello{.who = "w", .role = "worker", .incarnation = 5}), limits), limits).incarnation == 5);
  CHECK(unpack<Ack>(decode_frame(pack(Ack{.seq = 3, .credits = 8, .duplicate = true}), limits), limits).duplicate);
  CHECK(unpack<ErrorRecord>(decode_frame(pack(ErrorRecord{1, "data", "bad task"}), limits), limits).reason == "bad task");
  Stats st{.values = {{"a", 1.5}, {"b", -2}}};
  CHECK((unpack<Stats>(decode_frame(pack(st), limits), limits).values == st.values));
  BatchHead head{.batch_id = 4, .end = true, .groups = 2};
  auto got_head = unpack<BatchHead>(decode_frame(pack(head), limits), limits);
  CHECK(got_head.batch_id == 4);
  CHECK(got_head.groups == 2);
  CHECK(unpack<Control>(decode_frame(pack(Control{ControlCommand::stop}), limits), limits).command == ControlCommand::stop);
  auto ckpt = unpack<CheckpointSaved>(decode_frame(pack(CheckpointSaved{.name = "hub-step_4.state", .batch_id = 7}), limits),
                                      limits);
  CHECK(ckpt.name == "hub-step_4.state");
  CHECK(ckpt.batch_id == 7);
  EnvRequest env{.episode = 5, .turn = 2, .op = EnvOp::step, .env = "calc", .payload = "{}", .action = {1, 2}};
  auto got_env = unpack<EnvRequest>(decode_frame(pack(env), limits), limits);
  CHECK(got_env.op == EnvOp::step);
  CHECK(got_env.action == env.action);
  CHECK(to_string(EnvOp::load) == "load");
  CHECK(to_string(ControlCommand::save) == "save");
}

TEST_CASE("bus messages: a command or env op outside its enum is a malformed frame that names it", "[bus]") {
  const Limits limits;
  const std::string control_bytes = frame_with_payload(MsgType::control, std::string(1, '\3'));
  const auto control = decode_frame(control_bytes, limits);
  CHECK_THAT(rlx::test::error_of([&] { unpack<Control>(control, limits); }), Contains("unknown control command 3 (1 to 2)"));
  // episode u64, turn u64, then the op byte.
  const std::string env = pack(EnvRequest{.op = EnvOp::close}).substr(kHeaderBytes);
  for (const char op : {'\0', '\5'}) {
    std::string bad = env;
    bad[16] = op;
    const std::string bytes = frame_with_payload(MsgType::env_request, bad);
    const auto f = decode_frame(bytes, limits);
    CHECK_THAT(rlx::test::error_of([&] { unpack<EnvRequest>(f, limits); }),
               Contains(fmt::format("unknown env op {} (1 to 4)", static_cast<int>(op))));
    CHECK(reason_of([&] { unpack<EnvRequest>(f, limits); }) == Reject::malformed);
  }
}

TEST_CASE("bus messages: malformed frames are rejected with a reason", "[bus]") {
  const Limits limits{.max_frame_bytes = 1 << 20, .max_elements = 1 << 20};
  const std::string good = pack(sample_group(), 1);

  CHECK(reason_of([&] { decode_frame(good.substr(0, 10), limits); }) == Reject::truncated);
  CHECK(reason_of([&] { decode_frame(good.substr(0, good.size() - 1), limits); }) == Reject::length_mismatch);
  CHECK(reason_of([&] { decode_frame(good + "x", limits); }) == Reject::length_mismatch);
  auto bad = good;
  bad[0] = 'X';
  CHECK(reason_of([&] { decode_frame(bad, limits); }) == Reject::bad_magic);
  bad = good;
  bad[4] = 7;  // protocol version 7 (commands and env ops as text): refused, not misread
  CHECK_THAT(rlx::test::error_of([&] { decode_frame(bad, limits); }), Contains("protocol version 7 (this build speaks 8)"));
  CHECK(reason_of([&] { decode_frame(bad, limits); }) == Reject::bad_version);
  bad = good;
  bad[6] = 99;
  CHECK(reason_of([&] { decode_frame(bad, limits); }) == Reject::unknown_type);
  bad = good;
  bad[kHeaderBytes + 3] ^= 1;
  CHECK(reason_of([&] { decode_frame(bad, limits); }) == Reject::checksum);
  const std::string big = frame_with_payload(MsgType::heartbeat, std::string((1 << 20) + 1, 'a'));
  CHECK(reason_of([&] { decode_frame(big, limits); }) == Reject::oversize);

  // Valid frames whose payloads lie.
  auto f = [&](const std::string& payload) { return decode_frame(frame_with_payload(MsgType::trajectory_group, payload), limits); };
  // lease_id, prompt_index, epoch, worker "", then samples claiming 2^62 elements.
  const std::string head = raw<uint64_t>(1) + raw<uint64_t>(2) + raw<uint64_t>(3) + raw<uint64_t>(0);
  CHECK_THAT(rlx::test::error_of([&] { unpack<TrajectoryGroup>(f(head + raw<uint64_t>(uint64_t{1} << 62)), limits); }),
             Contains("claims 4611686018427387904 elements"));
  // One sample whose tokens claim 2^62 int32s.
  CHECK(reason_of([&] { unpack<TrajectoryGroup>(f(head + raw<uint64_t>(1) + raw<uint64_t>(uint64_t{1} << 62)), limits); }) ==
        Reject::malformed);
  // A string longer than what remains.
  CHECK(reason_of([&] { unpack<Heartbeat>(decode_frame(frame_with_payload(MsgType::heartbeat, raw<uint64_t>(100) + "abc"), limits), limits); }) ==
        Reject::malformed);
  // Truncated mid-field, trailing bytes, wrong type.
  const std::string payload = good.substr(kHeaderBytes);
  CHECK(reason_of([&] { unpack<TrajectoryGroup>(f(payload.substr(0, payload.size() - 3)), limits); }) == Reject::malformed);
  CHECK_THAT(rlx::test::error_of([&] { unpack<TrajectoryGroup>(f(payload + "zz"), limits); }), Contains("2 trailing bytes"));
  CHECK_THAT(rlx::test::error_of([&] { unpack<Ack>(decode_frame(good, limits), limits); }),
             Contains("expected a ack message, got trajectory_group"));
}

TEST_CASE("bus messages: a batch read in place names the damaged group, a packed batch's bad bytes are errors", "[bus]") {
  const Limits limits;
  auto g1 = sample_group(), g2 = sample_group();
  g2.lease_id = 43;
  const auto f1 = std::make_shared<std::string>(pack(g1, 5));
  const auto f2 = std::make_shared<std::string>(pack(g2, 6));
  const BatchHead head{.batch_id = 9, .groups = 2};
  const auto batch = read_batch(head, {*f1, *f2}, f1, limits);
  CHECK(to_group(batch.groups[1]) == g2);
  CHECK((batch.copy().groups == std::vector<TrajectoryGroup>{g1, g2}));
  // A flipped payload bit in the second group: named, with the reason.
  std::string bad = *f2;
  bad[kHeaderBytes + 9] ^= 1;
  CHECK_THAT(rlx::test::error_of([&] { read_batch(head, {*f1, bad}, f1, limits); }),
             Contains("group 1 of batch 9 is damaged (checksum)"));
  CHECK_THAT(rlx::test::error_of([&] { read_batch(head, {*f1}, f1, limits); }), Contains("names 2 groups"));
  // Round trip, then bytes that lie.
  const std::string packed = pack_batch(batch);
  const auto back = unpack_batch(std::make_shared<const std::string>(packed), limits);
  CHECK(back.copy() == batch.copy());
  CHECK(back.end == head.end);
  auto unpack_text = [&](std::string bytes) {
    return rlx::test::error_of([&] { unpack_batch(std::make_shared<const std::string>(std::move(bytes)), limits); });
  };
  CHECK_THAT(unpack_text(packed.substr(0, packed.size() - 1)), Contains("group 1 claims"));
  CHECK_THAT(unpack_text(packed + "x"), Contains("1 bytes after its 2 groups"));
  CHECK_THAT(unpack_text(packed.substr(0, 20)), Contains("the head ends after 20 bytes"));
  CHECK_THAT(unpack_text(pack(BatchHead{.batch_id = 1, .groups = uint64_t{1} << 62})), Contains("more than a batch has"));
  CHECK_THAT(unpack_text(pack(Ack{}) + *f1), Contains("damaged head"));
}

TEST_CASE("bus messages: a group read in place agrees with unpack on every payload", "[bus]") {
  const Limits limits{.max_frame_bytes = 1 << 20, .max_elements = 1 << 20};
  const TrajectoryGroup g = sample_group();
  const std::string good = pack(g, 3);
  const Frame f = decode_frame(good, limits);
  const GroupView view = parse_group(f, limits);
  CHECK(to_group(view) == g);
  CHECK(view.num_tokens() == g.num_tokens());
  CHECK(view.version_range() == g.version_range());
  CHECK(view.samples[1].logprobs[3] == -1.25f);
  CHECK(reason_of([&] { parse_group(decode_frame(pack(Heartbeat{"w"}), limits), limits); }) == Reject::malformed);
  // Truncated and bit-flipped payloads: parse_group fails exactly when unpack fails, and
  // reads the same group when both succeed (the hub validates with one, the learner reads
  // with the other).
  rlx::RngStream rng(11, 0);
  const std::string payload = good.substr(kHeaderBytes);
  int both_ok = 0, both_failed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string p = payload;
    if (i % 3 == 0) p.resize(static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(p.size()) - 1)));
    else
      for (int k = 0; k < 1 + i % 4; ++k)
        p[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(p.size()) - 1))] ^=
            static_cast<char>(1 << rng.uniform_int(0, 7));
    const std::string framed = frame_with_payload(MsgType::trajectory_group, p);
    const Frame mf = decode_frame(framed, limits);
    std::optional<TrajectoryGroup> a, b;
    try {
      a = to_group(parse_group(mf, limits));
    } catch (const FrameError&) {
    }
    try {
      b = unpack<TrajectoryGroup>(mf, limits);
    } catch (const FrameError&) {
    }
    REQUIRE(a.has_value() == b.has_value());
    if (a) {
      REQUIRE(pack(*a) == pack(*b));  // bytewise: a flipped bit may make a NaN
      ++both_ok;
    } else {
      ++both_failed;
    }
  }
  CHECK(both_ok > 100);  // flipped bits inside arrays still parse
  CHECK(both_failed > 100);
}

TEST_CASE("bus messages: random bytes never crash the decoder", "[bus]") {
  const Limits limits{.max_frame_bytes = 1 << 16, .max_elements = 1 << 16};
  rlx::RngStream rng(3);
  const std::string good = pack(sample_group(), 1);
  int rejected = 0, accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes;
    if (i % 2 == 0) {
      bytes.resize(static_cast<size_t>(rng.uniform_int(0, 200)));
      for (auto& c : bytes) c = static_cast<char>(rng.uniform_int(0, 255));
    } else {
      // A valid frame with a few payload bytes flipped and the checksum fixed: exercises unpack.
      std::string payload = good.substr(kHeaderBytes);
      for (int k = 0; k < 3; ++k)
        payload[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(payload.size()) - 1))] =
            static_cast<char>(rng.uniform_int(0, 255));
      bytes = frame_with_payload(MsgType::trajectory_group, payload);
    }
    try {
      auto fr = decode_frame(bytes, limits);
      if (fr.type == MsgType::trajectory_group) unpack<TrajectoryGroup>(fr, limits);
      ++accepted;
    } catch (const FrameError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 10000);  // all random ones, most of the flipped ones
  CHECK(accepted + rejected == 20000);
}
