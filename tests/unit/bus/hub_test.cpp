// The hub and its clients over real ZeroMQ sockets (in-process hub thread): saved state,
// malformed input, CURVE, and the HDF5 store.
#include "rlx/bus/hub.hpp"

#include <hdf5.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "../helpers.hpp"
#include "../hub_thread.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/bus/h5store.hpp"

using Catch::Matchers::Contains;
using namespace rlx::bus;
using rlx::test::TempDir;

namespace {
std::vector<std::string> prompts(int n) {
  std::vector<std::string> r;
  for (int i = 0; i < n; ++i) r.push_back(R"({"prompt":"q)" + std::to_string(i) + R"("})");
  return r;
}

TrajectoryGroup answer(const Lease& lease, int tokens = 6) {
  TrajectoryGroup g{.lease_id = lease.lease_id, .prompt_index = lease.prompt_index, .epoch = lease.epoch};
  for (uint32_t s = 0; s < lease.group_size; ++s) {
    Trajectory t;
    t.prompt_len = 2;
    for (int i = 0; i < tokens; ++i) {
      t.tokens.push_back(static_cast<int32_t>(lease.prompt_index * 100 + s * 10 + static_cast<uint64_t>(i)));
      t.loss_mask.push_back(i >= 2);
      t.logprobs.push_back(i >= 2 ? -0.5f * static_cast<float>(i) : 0.0f);
      t.versions.push_back(i >= 2 ? lease.min_version : -1);
    }
    t.reward = static_cast<float>(s);
    t.finish = s % 2 ? "length" : "stop";
    t.metadata = R"({"s":)" + std::to_string(s) + "}";
    // Odd prompts come from a mixture-of-experts model: 3 sparse layers, top 2, the last
    // token not forwarded.
    if (lease.prompt_index % 2 == 1) {
      t.routing = {.layers = 3, .top_k = 2};
      for (int i = 0; i < tokens * 6; ++i)
        t.routing.experts.push_back(i >= (tokens - 1) * 6 ? int16_t{-1} : static_cast<int16_t>((i * 7 + s) % 64));
    }
    g.samples.push_back(std::move(t));
  }
  return g;
}

using rlx::test::HubThread;

HubOptions options(const TempDir& dir, const std::string& name) {
  HubOptions o;
  o.address = "ipc://" + (dir / (name + ".sock")).string();
  o.group_size = 2;
  o.heartbeat_s = 0.1;
  o.peer_timeout_s = 2;
  return o;
}

ClientOptions worker(const std::string& address, const std::string& who) {
  return {.address = address, .who = who, .heartbeat_s = 0.1, .hub_timeout_s = 2, .request_timeout_s = 10, .credit_wait_s = 10};
}

double stat(const std::vector<std::pair<std::string, double>>& s, const std::string& key) {
  for (const auto& [k, v] : s)
    if (k == key) return v;
  return 0;
}

// A learner speaking the wire protocol directly, on a DEALER of its own.
struct RawLearner {
  zmq::context_t ctx{1};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  explicit RawLearner(const std::string& address) {
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::rcvtimeo, 10000);
    dealer.connect(address);
  }
  static std::string text(const zmq::message_t& m) { return {static_cast<const char*>(m.data()), m.size()}; }
  // The next message from the hub that is not a heartbeat, all its parts.
  std::vector<zmq::message_t> receive() {
    for (;;) {
      std::vector<zmq::message_t> parts;
      REQUIRE(zmq::recv_multipart(dealer, std::back_inserter(parts)));
      if (decode_frame(text(parts.at(0)), Limits{}).type != MsgType::heartbeat) return parts;
    }
  }
  std::vector<zmq::message_t> ask(const std::string& frame) {
    dealer.send(zmq::buffer(frame));
    return receive();
  }
};

// A worker that takes `n` leases and submits a group for each, all acknowledged.
void submit_all(const std::string& address, int n) {
  Client w(worker(address, "w0"));
  auto grant = w.request_leases(static_cast<uint32_t>(n));
  REQUIRE(grant.leases.size() == static_cast<size_t>(n));
  for (const auto& l : grant.leases) w.submit(answer(l));
  REQUIRE(w.flush(10));
}

// While it lives, this process cannot write a file past `bytes` (EFBIG, "File too large"):
// a full disk, without mounting one.
struct FileSizeLimit {
  rlimit old{};
  explicit FileSizeLimit(rlim_t bytes) {
    std::signal(SIGXFSZ, SIG_IGN);  // the write fails instead of the process ending
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    rlimit r = old;
    r.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &r) == 0);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &old); }
};

HubSnapshot without_deadlines(HubSnapshot s) {
  for (auto& a : s.leases.active) a.remaining_s = 0;
  return s;
}
}  // namespace

TEST_CASE("bus: the HDF5 store round-trips groups and truncates to a saved count", "[bus]") {
  TempDir dir;
  const auto file = dir / "t.h5";
  std::vector<TrajectoryGroup> groups;
  {
    TrajectoryStore store(file);
    for (uint64_t i = 0; i < 5; ++i) {
      auto g = answer(Lease{.lease_id = i + 1, .prompt_index = i, .group_size = 3}, 4 + static_cast<int>(i));
      g.worker = "w" + std::to_string(i % 2);
      CHECK(store.append(g, 7));
      groups.push_back(g);
    }
    CHECK(store.groups() == 5);
    CHECK(store.samples() == 15);
  }
  CHECK(std::filesystem::file_size(file) < (size_t{2} << 20));  // the space reserved for writes is given back at close
  auto back = read_trajectory_groups(file, 0, 100);
  CHECK((back == groups));
  CHECK((read_trajectory_groups(file, 3, 1) == std::vector<TrajectoryGroup>{groups[3]}));
  const auto s = summarize_trajectories(file);
  CHECK(s.groups == 5);
  CHECK(s.distinct_leases == 5);
  CHECK(s.finish.at("stop") == 10);
  CHECK(s.workers.at("w0") == 3);
  {
    TrajectoryStore store(file);  // reopen, append after truncation
    store.truncate(2);
    CHECK(store.append(groups[4], 8));
    CHECK(store.groups() == 3);
  }
  back = read_trajectory_groups(file, 0, 100);
  REQUIRE(back.size() == 3);
  CHECK((back[2] == groups[4]));
  rlx::test::write_file(dir / "bad.h5", "not hdf5");
  CHECK_THAT(rlx::test::error_of([&] { summarize_trajectories(dir / "bad.h5"); }), Contains("not an HDF5 file"));
}

// Sets the length of dataset `name` in `file`, as a writer killed past its last flush can
// leave it (longer: entries HDF5 never wrote read as zeros).
void set_length(const std::filesystem::path& file, const char* name, hsize_t n) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  REQUIRE(d >= 0);
  CHECK(H5Dset_extent(d, &n) >= 0);
  H5Dclose(d);
  H5Fclose(f);
}

TEST_CASE("bus: a trajectory file whose columns a killed writer left of different lengths opens at its whole groups",
          "[bus]") {
  TempDir dir;
  std::vector<TrajectoryGroup> groups;
  for (uint64_t i = 0; i < 8; ++i)
    groups.push_back(answer(Lease{.lease_id = i + 1, .prompt_index = i, .group_size = 3}, 4 + static_cast<int>(i)));
  const auto text_of = [&](size_t n) {  // bytes of text of the first n groups
    uint64_t t = 0;
    for (size_t i = 0; i < n; ++i) {
      t += groups[i].worker.size();
      for (const auto& s : groups[i].samples) t += s.finish.size() + s.metadata.size();
    }
    return t;
  };
  const auto tokens_of = [&](size_t n) {
    uint64_t t = 0;
    for (size_t i = 0; i < n; ++i)
      for (const auto& s : groups[i].samples) t += s.tokens.size();
    return t;
  };
  const auto routing_of = [&](size_t n) {
    uint64_t t = 0;
    for (size_t i = 0; i < n; ++i)
      for (const auto& s : groups[i].samples) t += s.routing.experts.size();
    return t;
  };
  REQUIRE(!groups[5].samples[2].routing.empty());
  // Each tear, and the whole groups the file still holds.
  const std::vector<std::pair<std::function<void(const std::filesystem::path&)>, uint64_t>> tears = {
      {[&](const auto& f) {  // per-sample and per-token columns ran ahead of the groups
         set_length(f, "sample_offset", 6 * 3 + 2);
         set_length(f, "metadata_length", 6 * 3 + 3);
         set_length(f, "tokens", tokens_of(6) + 40);
         set_length(f, "text", 100000);
       }, 6},
      {[&](const auto& f) {  // the per-group columns ran ahead: their new entries read as zeros
         for (const char* n : {"group_lease_id", "group_prompt_index", "group_epoch", "group_first_sample",
                               "group_num_samples", "group_worker_offset", "group_worker_length", "group_accepted_version"})
           set_length(f, n, 9);
       }, 6},
      {[&](const auto& f) { set_length(f, "metadata_offset", 6 * 3 - 1); }, 5},  // the last group's samples fell short
      {[&](const auto& f) { set_length(f, "text", text_of(6) - 1); }, 5},       // its last sample's text did
      {[&](const auto& f) { set_length(f, "logprobs", tokens_of(6) - 1); }, 5},  // its last sample's tokens did
      {[&](const auto& f) {  // runs of versions ran ahead (two a sample here: the prompt's, then the lease's)
         set_length(f, "run_version", 6 * 3 * 2 + 5);
         set_length(f, "sample_first_run", 6 * 3 + 1);
       }, 6},
      {[&](const auto& f) { set_length(f, "run_length", 6 * 3 * 2 - 1); }, 5},  // its last sample's runs fell short
      {[&](const auto& f) {  // routing ran ahead
         set_length(f, "routing", routing_of(6) + 100);
         set_length(f, "sample_routing_top_k", 6 * 3 + 2);
       }, 6},
      {[&](const auto& f) { set_length(f, "routing", routing_of(6) - 1); }, 5},  // its last (routed) sample's fell short
      {[&](const auto& f) { set_length(f, "sample_routing_layers", 6 * 3 - 1); }, 5},
  };
  for (size_t k = 0; k < tears.size(); ++k) {
    INFO("tear " << k);
    const auto file = dir / ("torn" + std::to_string(k) + ".h5");
    {
      TrajectoryStore store(file);
      for (size_t i = 0; i < 6; ++i) REQUIRE(store.append(groups[i], 1));
    }
    tears[k].first(file);
    const uint64_t whole = tears[k].second;
    CHECK(summarize_trajectories(file).groups == whole);
    {
      TrajectoryStore store(file);
      CHECK(store.groups() == whole);
      CHECK(store.samples() == whole * 3);
      CHECK(store.tokens() == tokens_of(whole));
      REQUIRE(store.append(groups[6], 2));  // appends line up again in every column
      REQUIRE(store.append(groups[7], 2));
    }
    auto want = std::vector<TrajectoryGroup>(groups.begin(), groups.begin() + static_cast<long>(whole));
    want.push_back(groups[6]);
    want.push_back(groups[7]);
    CHECK((read_trajectory_groups(file, 0, 100) == want));
  }
}

// A trajectory file of format 1 (a weight version per token) or 2 (versions as runs), as
// the builds before format 3 wrote it: HDF5 variable-length strings, the default format.
void write_legacy(const std::filesystem::path& file, int version, const std::vector<TrajectoryGroup>& groups) {
  const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t scalar = H5Screate(H5S_SCALAR), name_type = H5Tcopy(H5T_C_S1), str = H5Tcopy(H5T_C_S1);
  H5Tset_size(name_type, 16);
  H5Tset_size(str, H5T_VARIABLE);
  const hid_t a = H5Acreate2(f, "format", name_type, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, name_type, "rlx-trajectories");
  const hid_t v = H5Acreate2(f, "format_version", H5T_NATIVE_INT, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(v, H5T_NATIVE_INT, &version);
  const auto column = [&](const char* name, hid_t type, const void* data, size_t n) {
    const hsize_t dims = n, unlimited = H5S_UNLIMITED, chunk = 64;
    const hid_t space = H5Screate_simple(1, &dims, &unlimited), plist = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(plist, 1, &chunk);
    const hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT);
    REQUIRE(d >= 0);
    if (n) REQUIRE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(d), H5Pclose(plist), H5Sclose(space);
  };
  std::vector<int32_t> tokens, prompt_len;
  std::vector<uint8_t> mask;
  std::vector<float> logprobs, reward;
  std::vector<int64_t> versions, run_version, offset, length, first_run, num_runs, first_sample, num_samples, accepted;
  std::vector<uint32_t> run_length;
  std::vector<uint64_t> lease, prompt, epoch;
  std::vector<const char*> finish, metadata, worker;
  for (const auto& g : groups) {
    first_sample.push_back(static_cast<int64_t>(offset.size()));
    num_samples.push_back(static_cast<int64_t>(g.samples.size()));
    for (const auto& t : g.samples) {
      offset.push_back(static_cast<int64_t>(tokens.size())), length.push_back(static_cast<int64_t>(t.tokens.size()));
      tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
      mask.insert(mask.end(), t.loss_mask.begin(), t.loss_mask.end());
      logprobs.insert(logprobs.end(), t.logprobs.begin(), t.logprobs.end());
      const auto per_token = t.versions.per_token();
      versions.insert(versions.end(), per_token.begin(), per_token.end());
      first_run.push_back(static_cast<int64_t>(run_version.size()));
      num_runs.push_back(static_cast<int64_t>(t.versions.runs()));
      const auto values = t.versions.run_values();
      const auto lengths = t.versions.run_lengths();
      run_version.insert(run_version.end(), values.begin(), values.end());
      run_length.insert(run_length.end(), lengths.begin(), lengths.end());
      prompt_len.push_back(t.prompt_len), reward.push_back(t.reward);
      finish.push_back(t.finish.c_str()), metadata.push_back(t.metadata.c_str());
    }
    lease.push_back(g.lease_id), prompt.push_back(g.prompt_index), epoch.push_back(g.epoch);
    worker.push_back(g.worker.c_str());
    accepted.push_back(static_cast<int64_t>(lease.size()) * 10);
  }
  column("tokens", H5T_NATIVE_INT32, tokens.data(), tokens.size());
  column("loss_mask", H5T_NATIVE_UINT8, mask.data(), mask.size());
  column("logprobs", H5T_NATIVE_FLOAT, logprobs.data(), logprobs.size());
  if (version == 1) {
    column("versions", H5T_NATIVE_INT64, versions.data(), versions.size());
  } else {
    column("run_version", H5T_NATIVE_INT64, run_version.data(), run_version.size());
    column("run_length", H5T_NATIVE_UINT32, run_length.data(), run_length.size());
    column("sample_first_run", H5T_NATIVE_INT64, first_run.data(), first_run.size());
    column("sample_num_runs", H5T_NATIVE_INT64, num_runs.data(), num_runs.size());
  }
  column("sample_offset", H5T_NATIVE_INT64, offset.data(), offset.size());
  column("sample_length", H5T_NATIVE_INT64, length.data(), length.size());
  column("prompt_len", H5T_NATIVE_INT32, prompt_len.data(), prompt_len.size());
  column("reward", H5T_NATIVE_FLOAT, reward.data(), reward.size());
  column("finish", str, finish.data(), finish.size());
  column("metadata", str, metadata.data(), metadata.size());
  column("group_lease_id", H5T_NATIVE_UINT64, lease.data(), lease.size());
  column("group_prompt_index", H5T_NATIVE_UINT64, prompt.data(), prompt.size());
  column("group_epoch", H5T_NATIVE_UINT64, epoch.data(), epoch.size());
  column("group_first_sample", H5T_NATIVE_INT64, first_sample.data(), first_sample.size());
  column("group_num_samples", H5T_NATIVE_INT64, num_samples.data(), num_samples.size());
  column("group_worker", str, worker.data(), worker.size());
  column("group_accepted_version", H5T_NATIVE_INT64, accepted.data(), accepted.size());
  H5Aclose(a), H5Aclose(v), H5Tclose(str), H5Tclose(name_type), H5Sclose(scalar), H5Fclose(f);
}

// A trajectory file of format 3 (this build's without routing), as the builds before format 4
// wrote it: this build's file with its routing columns taken out.
void write_v3(const std::filesystem::path& file, const std::vector<TrajectoryGroup>& groups) {
  {
    TrajectoryStore store(file);
    for (size_t i = 0; i < groups.size(); ++i) REQUIRE(store.append(groups[i], static_cast<int64_t>(i + 1) * 10));
  }
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  for (const char* name : {"routing", "sample_routing_offset", "sample_routing_layers", "sample_routing_top_k"})
    REQUIRE(H5Ldelete(f, name, H5P_DEFAULT) >= 0);
  const hid_t v = H5Aopen(f, "format_version", H5P_DEFAULT);
  const int three = 3;
  REQUIRE(H5Awrite(v, H5T_NATIVE_INT, &three) >= 0);
  H5Aclose(v), H5Fclose(f);
}

// Column `name` of `file` (closed), read as int64.
std::vector<int64_t> read_int64_column(const std::filesystem::path& file, const char* name) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  REQUIRE(d >= 0);
  const hid_t space = H5Dget_space(d);
  std::vector<int64_t> out(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  if (!out.empty()) H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Sclose(space), H5Dclose(d), H5Fclose(f);
  return out;
}

TEST_CASE("bus: trajectory files of formats 1 to 3 are refused, naming the upgrade, and upgrade whole", "[bus]") {
  TempDir dir;
  std::vector<TrajectoryGroup> groups;
  for (uint64_t i = 0; i < 70; ++i) {  // past one 64-group read of the upgrade
    groups.push_back(answer(Lease{.lease_id = i + 1, .prompt_index = i, .group_size = 3, .min_version = static_cast<int64_t>(i % 4)},
                            3 + static_cast<int>(i % 5)));
    groups.back().worker = "w" + std::to_string(i % 3);
  }
  groups[5].samples[1].metadata = std::string(3000, 'm');  // longer than a chunk of text
  groups[6].samples[0].finish = "";
  for (auto& g : groups)
    for (auto& t : g.samples) t.routing = {};  // formats before 4 hold none
  for (int version : {1, 2, 3}) {
    INFO("format " << version);
    const auto old = dir / fmt::format("v{}.h5", version), upgraded = dir / fmt::format("v{}-up.h5", version);
    if (version == 3) write_v3(old, groups);
    else write_legacy(old, version, groups);
    CHECK_THAT(rlx::test::error_of([&] { summarize_trajectories(old); }),
               Contains(fmt::format("trajectory format version {} (this build reads 4", version)) && Contains("--upgrade-to"));
    CHECK_THAT(rlx::test::error_of([&] { TrajectoryStore store(old); }), Contains("--upgrade-to"));
    CHECK(upgrade_trajectories(old, upgraded) == groups.size());
    CHECK((read_trajectory_groups(upgraded, 0, 1000) == groups));
    const auto accepted = read_int64_column(upgraded, "group_accepted_version");
    REQUIRE(accepted.size() == groups.size());
    for (size_t i = 0; i < accepted.size(); ++i) CHECK(accepted[i] == static_cast<int64_t>(i + 1) * 10);
    CHECK(summarize_trajectories(upgraded).workers.at("w1") == 23);
    CHECK_THAT(rlx::test::error_of([&] { upgrade_trajectories(old, upgraded); }), Contains("exists"));
    CHECK_THAT(rlx::test::error_of([&] { upgrade_trajectories(upgraded, dir / "again.h5"); }), Contains("this build's already"));
  }
}

TEST_CASE("bus: a trajectory file has one writer, and what it stages goes to the file within max_stage_age_s", "[bus]") {
  TempDir dir;
  const auto file = dir / "one.h5";
  const auto group = answer(Lease{.lease_id = 1, .prompt_index = 0, .group_size = 2}, 8);
  {
    TrajectoryStore store(file, StoreOptions{.max_stage_age_s = 0.2});
    CHECK_THAT(rlx::test::error_of([&] { TrajectoryStore second(file); }),
               Contains("being written by another process") && Contains("one.h5"));
    REQUIRE(store.append(group, 1));
    CHECK(store.pending_bytes() > 0);
    CHECK(store.write_if_due());
    CHECK(store.pending_bytes() > 0);  // not yet due
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    CHECK(store.write_if_due());
    CHECK(store.pending_bytes() == 0);
  }
  TrajectoryStore again(file);  // the first writer's lock ended with it
  CHECK(again.groups() == 1);
}

TEST_CASE("bus: the HDF5 store writes appends in bulk, truncate, flush and close write what waits first", "[bus]") {
  TempDir dir;
  const auto file = dir / "bulk.h5";
  std::vector<TrajectoryGroup> groups;
  for (uint64_t i = 0; i < 35; ++i)  // 4 x 22,000 tokens: 0.8 MB each (9 bytes a token), so 10 fill the 8 MiB stage
    groups.push_back(answer(Lease{.lease_id = i + 1, .prompt_index = i, .group_size = 4}, 22000 + static_cast<int>(i)));
  {
    TrajectoryStore store(file);
    for (uint64_t i = 0; i < 35; ++i) CHECK(store.append(groups[i], static_cast<int64_t>(i)));
    CHECK(store.groups() == 35);
    CHECK(store.tokens() == 35 * 4 * 22000 + 4 * (34 * 35 / 2));
    store.truncate(33);  // inside the groups still staged (31 to 35)
    CHECK(store.groups() == 33);
    CHECK(store.append(groups[34], 99));
    store.flush();
    CHECK(store.append(groups[0], 100));  // staged at close
  }
  const auto back = read_trajectory_groups(file, 0, 100);
  REQUIRE(back.size() == 35);
  for (size_t i = 0; i < 33; ++i) CHECK((back[i] == groups[i]));
  CHECK((back[33] == groups[34]));
  CHECK((back[34] == groups[0]));
}

TEST_CASE("bus: a write the file cannot take leaves it as it was and keeps the groups staged until it can", "[bus]") {
  TempDir dir;
  const auto file = dir / "full.h5";
  std::vector<TrajectoryGroup> groups;
  for (uint64_t i = 0; i < 30; ++i) {  // 4 x 22,000 tokens: 0.8 MB each (no routing)
    groups.push_back(answer(Lease{.lease_id = i + 1, .prompt_index = i, .group_size = 4}, 22000 + static_cast<int>(i)));
    for (auto& t : groups.back().samples) t.routing = {};
  }
  const StoreOptions small{.stage_bytes = size_t{4} << 20, .max_pending_bytes = size_t{12} << 20};
  size_t refused_at = 0;
  {
    std::optional<FileSizeLimit> limit;  // outlives the store: its close cannot write either
    TrajectoryStore store(file, small);
    for (size_t i = 0; i < 5; ++i) CHECK(store.append(groups[i], 1));
    store.flush();
    limit.emplace(std::filesystem::file_size(file) + (size_t{1} << 20));
    for (refused_at = 5; refused_at < groups.size() && store.append(groups[refused_at], 2); ++refused_at) {}
    CHECK(store.full());
    CHECK(store.write_failures() >= 2);  // at 4 MiB staged, then again at 8 MiB
    CHECK_THAT(store.last_error(), Contains("File too large"));
    CHECK(store.groups() == refused_at);
    CHECK_THAT(rlx::test::error_of([&] { store.flush(); }), Contains("not in the file") && Contains("File too large"));
  }  // closed while the file still cannot grow: what was staged is lost, the file is whole
  REQUIRE(refused_at > 9);
  REQUIRE(refused_at < groups.size());
  auto back = read_trajectory_groups(file, 0, 100);
  REQUIRE(back.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK((back[i] == groups[i]));
  const auto s = summarize_trajectories(file);
  CHECK(s.samples == 20);
  CHECK(s.tokens == 5 * 4 * 22000 + 4 * (0 + 1 + 2 + 3 + 4));  // no column longer than its groups
  {
    TrajectoryStore store(file, small);
    CHECK(store.groups() == 5);
    {
      FileSizeLimit limit(std::filesystem::file_size(file) + (size_t{1} << 20));
      for (size_t i = 5; i < 12; ++i) CHECK(store.append(groups[i], 2));
      CHECK(store.write_failures() == 1);
      CHECK_FALSE(store.write_pending());
    }
    CHECK(store.write_pending());  // the disk has room again: everything staged goes
    CHECK(store.last_error().empty());
    CHECK(store.pending_bytes() == 0);
    for (size_t i = 12; i < groups.size(); ++i) CHECK(store.append(groups[i], 3));
  }
  back = read_trajectory_groups(file, 0, 100);
  REQUIRE(back.size() == groups.size());
  for (size_t i = 0; i < groups.size(); ++i) CHECK((back[i] == groups[i]));
}

TEST_CASE("bus: while the trajectory file cannot be written, the hub keeps groups up to its bound, then takes none until it can",
          "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.trajectory_file = (dir / "t.h5").string();
  o.state_file = (dir / "state.bin").string();
  o.store_max_pending_mb = 16;
  o.credits_per_peer = 8;
  o.save_every_s = 0.2;  // periodic saves fail too while the file cannot be written; the hub goes on
  const int n = 40;
  std::map<std::string, double> during;
  {
    HubThread h(o, prompts(n));
    Client w(worker(o.address, "w0"));
    Client monitor({.address = o.address, .who = "m", .role = "monitor"});
    auto grant = w.request_leases(n);
    REQUIRE(grant.leases.size() == static_cast<size_t>(n));
    for (int i = 0; i < 5; ++i) w.submit(answer(grant.leases[static_cast<size_t>(i)], 45000));
    REQUIRE(w.flush(10));
    monitor.control(ControlCommand::save);  // writes the five
    std::optional<FileSizeLimit> limit(std::filesystem::file_size(o.trajectory_file) + (size_t{1} << 20));
    std::exception_ptr failed;
    std::thread submitter([&] {
      try {
        for (int i = 5; i < n; ++i) w.submit(answer(grant.leases[static_cast<size_t>(i)], 45000));
      } catch (...) {
        failed = std::current_exception();
      }
    });
    for (int i = 0; i < 200 && stat(monitor.hub_stats(), "groups_store_full") == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the worker is out of credit by now
    for (const auto& [k, v] : monitor.hub_stats()) during[k] = v;
    CHECK_THAT(rlx::test::error_of([&] { monitor.control(ControlCommand::save); }), Contains("File too large"));
    CHECK(std::filesystem::exists(o.state_file));  // the last good save stays
    limit.reset();  // room again: the hub's next retry writes, and credit flows
    submitter.join();
    if (failed) std::rethrow_exception(failed);
    REQUIRE(w.flush(20));
    CHECK(w.counters().verdicts["accepted"] == static_cast<uint64_t>(n));
    CHECK(w.counters().verdicts.count("full") == 0);  // "full" is not an answer: the group goes again
  }
  CHECK(during["groups_store_full"] >= 1);
  CHECK(during["store_write_failures"] >= 1);
  CHECK(during["store_pending_mb"] >= 16);
  CHECK(during["store_pending_mb"] < 17);  // the bound, plus the one group that reached it
  CHECK(during["credits_outstanding"] == 0);
  CHECK(during["save_failures"] >= 1);
  const auto s = summarize_trajectories(o.trajectory_file);
  CHECK(s.groups == static_cast<uint64_t>(n));
  CHECK(s.distinct_leases == static_cast<uint64_t>(n));
  CHECK(read_snapshot(o.state_file).stored_groups == static_cast<uint64_t>(n));
}

TEST_CASE("bus: a store whose writer is SIGKILLed opens again and holds every group flushed before", "[bus]") {
  TempDir dir;
  const auto file = dir / "killed.h5";
  // Group i is the same in every process: 4 samples of 1,000 to 7,000 tokens.
  const auto group = [](uint64_t i) {
    return answer(Lease{.lease_id = i + 1, .prompt_index = i, .group_size = 4}, 1000 + static_cast<int>(i * 7919 % 6000));
  };
  std::mt19937 rng(7);
  uint64_t flushed = 0;
  for (int round = 0; round < 6; ++round) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // the writer: appends from `flushed` on, flushing every 7 groups, until killed
      ::close(fds[0]);
      try {
        TrajectoryStore store(file);
        if (store.groups() > flushed) store.truncate(flushed);
        for (uint64_t i = flushed;; ++i) {
          if (!store.append(group(i), static_cast<int64_t>(i))) ::_exit(3);
          if ((i + 1) % 7 == 0) {
            store.flush();
            const uint64_t n = i + 1;
            if (::write(fds[1], &n, sizeof n) != sizeof n) ::_exit(4);
          }
        }
      } catch (...) {
        ::_exit(2);
      }
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(150, 700)(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));  // it was writing, not ended by an error
    for (uint64_t n = 0; ::read(fds[0], &n, sizeof n) == sizeof n;) flushed = n;
    ::close(fds[0]);
    INFO("round " << round << ": " << flushed << " groups flushed");
    TrajectoryStore store(file);
    REQUIRE(store.groups() >= flushed);
    store.truncate(flushed);
    REQUIRE(store.groups() == flushed);
  }
  REQUIRE(flushed > 100);
  const auto back = read_trajectory_groups(file, 0, flushed);
  REQUIRE(back.size() == flushed);
  for (uint64_t i = 0; i < flushed; ++i) CHECK((back[i] == group(i)));
}

TEST_CASE("bus: a hub restarted from its saved state has the same cursor, leases and buffer", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.state_file = (dir / "state.bin").string();
  o.trajectory_file = (dir / "t.h5").string();
  HubSnapshot saved;
  {
    HubThread h(o, prompts(20));
    Client w(worker(o.address, "w0"));
    auto grant = w.request_leases(6);
    REQUIRE(grant.leases.size() == 6);
    for (int i = 0; i < 4; ++i) w.submit(answer(grant.leases[static_cast<size_t>(i)]));
    REQUIRE(w.flush(10));
    Client monitor({.address = o.address, .who = "m", .role = "monitor"});
    monitor.control(ControlCommand::save);
    std::filesystem::copy_file(o.state_file, dir / "saved.bin");  // the hub saves again when it stops
    saved = read_snapshot(o.state_file);
    CHECK(saved.cursor.position == 6);
    CHECK(saved.leases.active.size() == 2);
    CHECK(saved.buffer.size() == 4);
    CHECK(saved.stored_groups == 4);
    // Accepted after the save: must vanish from the restored hub and from the file.
    w.submit(answer(grant.leases[4]));
    REQUIRE(w.flush(10));
  }
  o.state_file = (dir / "saved.bin").string();
  Hub restored(o, prompts(20));
  CHECK((without_deadlines(restored.snapshot()) == without_deadlines(saved)));
  CHECK(summarize_trajectories(o.trajectory_file).groups == 4);
  // A damaged state file is detected, naming the file.
  auto bytes = rlx::test::read_file(o.state_file);
  bytes[bytes.size() / 2] ^= 0x40;
  rlx::test::write_file(dir / "damaged.bin", bytes);
  CHECK_THAT(rlx::test::error_of([&] { read_snapshot((dir / "damaged.bin").string()); }), Contains("damaged"));
}

TEST_CASE("bus: malformed frames are rejected and counted while honest peers are served", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.max_frame_mb = 1;
  HubThread h(o, prompts(8));
  zmq::context_t ctx(1);
  zmq::socket_t evil(ctx, zmq::socket_type::dealer);
  evil.set(zmq::sockopt::linger, 0);
  evil.connect(o.address);
  std::mt19937 rng(7);
  std::string noise(500, '\0');
  for (auto& c : noise) c = static_cast<char>(rng());
  const std::string hello = pack(Hello{"evil", "worker", 1}, 1);
  std::string huge_claim = pack(LeaseRequest{1}, 2);
  {  // a valid header claiming 2^62 elements in a lease grant's vector
    std::string payload(8, '\0');
    const uint64_t n = uint64_t{1} << 62;
    std::memcpy(payload.data(), &n, 8);
    huge_claim = encode_frame(MsgType::lease_grant, 3, payload);
  }
  std::string wrong_version = hello;
  wrong_version[4] = 9;
  std::string oversize_claim = hello;
  const uint64_t big = uint64_t{1} << 40;
  std::memcpy(oversize_claim.data() + 20, &big, 8);
  std::string bad_checksum = hello;
  bad_checksum.back() ^= 1;
  for (const std::string& f : {noise, hello.substr(0, 20), hello.substr(0, hello.size() - 3), huge_claim, wrong_version,
                               oversize_claim, bad_checksum, std::string()})
    evil.send(zmq::buffer(f), zmq::send_flags::none);
  // A payload that decodes as a group but lies about its lease: refused with a reason.
  Client honest(worker(o.address, "honest"));
  size_t done = 0;
  for (;;) {
    auto grant = honest.request_leases(3);
    if (grant.exhausted) break;
    for (const auto& l : grant.leases) honest.submit(answer(l)), ++done;
  }
  REQUIRE(honest.flush(10));
  CHECK(done == 8);
  Client monitor({.address = o.address, .who = "m", .role = "monitor"});
  // The bad peer's frames arrive on their own connection, in their own time (bounded wait).
  auto s = monitor.hub_stats();
  for (int i = 0; i < 100 && stat(s, "rejected") < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s = monitor.hub_stats();
  }
  CHECK(stat(s, "rejected") == 8);
  CHECK(stat(s, "groups_accepted") == 8);
  CHECK(stat(s, "rejected_bad_magic") >= 1);
  CHECK(stat(s, "rejected_truncated") >= 2);
  CHECK(stat(s, "rejected_length_mismatch") >= 1);
  CHECK(stat(s, "rejected_bad_version") >= 1);
  CHECK(stat(s, "rejected_oversize") >= 1);
  CHECK(stat(s, "rejected_checksum") >= 1);
  CHECK(stat(s, "rejected_malformed") + stat(s, "rejected_invalid") >= 1);  // the 2^62 claim
  // A peer that says hello and then sends a group for a lease it never held.
  Client liar(worker(o.address, "liar"));
  liar.submit(answer(Lease{.lease_id = 999, .group_size = 2}));
  REQUIRE(liar.flush(10));
  CHECK(liar.counters().verdicts.at("duplicate") == 1);
}

TEST_CASE("bus: the hub refuses a group whose routing is malformed and stores routed groups whole", "[bus][routing]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.trajectory_file = (dir / "t.h5").string();
  std::vector<TrajectoryGroup> sent;
  {
    HubThread h(o, prompts(4));
    Client w(worker(o.address, "w0"));
    auto grant = w.request_leases(4);
    REQUIRE(grant.leases.size() == 4);
    for (const auto& l : grant.leases) {
      auto g = answer(l);  // odd prompts carry routing
      if (l.prompt_index == 1) g.samples[1].routing.experts[3] = 4096;  // past any layer's experts
      if (l.prompt_index == 0) {  // two shapes in one group
        g.samples[0].routing = {.layers = 2, .top_k = 3, .experts = std::vector<int16_t>(36, 0)};
        g.samples[1].routing = {.layers = 3, .top_k = 2, .experts = std::vector<int16_t>(36, 0)};
      }
      w.submit(g);
      if (l.prompt_index >= 2) sent.push_back(g);
    }
    REQUIRE(w.flush(10));
    CHECK(w.counters().verdicts.at("invalid") == 2);
    CHECK(w.counters().verdicts.at("accepted") == 2);
    Client monitor({.address = o.address, .who = "m", .role = "monitor"});
    CHECK(stat(monitor.hub_stats(), "groups_accepted") == 2);
  }
  auto stored = read_trajectory_groups(o.trajectory_file, 0, 10);
  std::sort(stored.begin(), stored.end(), [](const auto& a, const auto& b) { return a.prompt_index < b.prompt_index; });
  for (auto& g : sent) g.worker = "w0";  // the client names the sender
  REQUIRE(stored.size() == 2);
  CHECK(stored[0].samples[1].routing.empty());  // prompt 2: none
  CHECK(stored[1].samples[1].routing.layers == 3);
  CHECK((stored == sent));
}

TEST_CASE("bus: CURVE admits only listed client keys", "[bus]") {
  TempDir dir;
  write_curve_keys(generate_curve_keys(), dir.path, "hub");
  write_curve_keys(generate_curve_keys(), dir.path, "good");
  write_curve_keys(generate_curve_keys(), dir.path, "stranger");
  rlx::test::write_file(dir / "allowed", "# admitted clients\n" + rlx::test::read_file(dir / "good.pub"));
  CHECK_THAT(rlx::test::error_of([&] { write_curve_keys(generate_curve_keys(), dir.path, "hub"); }), Contains("exists"));
  HubOptions o = options(dir, "unused");
  o.address = "tcp://127.0.0.1:0";
  o.curve = {.key_file = (dir / "hub.key").string(), .allowed_clients_file = (dir / "allowed").string()};
  HubThread h(o, prompts(4));
  const std::string endpoint = h.hub.endpoint();
  auto client = [&](const std::string& key) {
    ClientOptions c = worker(endpoint, "c-" + key);
    c.request_timeout_s = 1.5;
    if (!key.empty()) c.curve = {.key_file = (dir / (key + ".key")).string(), .server_key_file = (dir / "hub.pub").string()};
    return c;
  };
  {
    Client plain(client(""));
    CHECK_THAT(rlx::test::error_of([&] { plain.request_leases(1); }), Contains("did not answer"));
  }
  {
    Client stranger(client("stranger"));
    CHECK_THAT(rlx::test::error_of([&] { stranger.request_leases(1); }), Contains("did not answer"));
  }
  Client good(client("good"));
  CHECK(good.request_leases(1).leases.size() == 1);
  const auto s = h.hub.stats();
  CHECK(stat(s, "curve_refused") >= 1);
  CHECK(stat(s, "curve_accepted") >= 1);
  // Keys are validated with file and line.
  rlx::test::write_file(dir / "broken.pub", "public = tooshort\n");
  CHECK_THAT(rlx::test::error_of([&] { read_curve_keys(dir / "broken.pub"); }), Contains("broken.pub:1"));
}

TEST_CASE("bus: the staleness gate issues leases at most max_staleness versions ahead", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.groups_per_version = 2;
  o.replay.max_staleness = 1;
  HubThread h(o, prompts(20));
  Client w(worker(o.address, "w"));
  // Version 0, staleness 1: (0 + 1 + 1) * 2 = 4 groups may be started.
  auto grant = w.request_leases(10);
  CHECK(grant.leases.size() == 4);
  CHECK(w.request_leases(10).leases.empty());
  Client learner({.address = o.address, .who = "l", .role = "learner", .request_timeout_s = 10});
  learner.publish_version(1);
  CHECK(w.request_leases(10).leases.size() == 2);
  for (const auto& l : grant.leases) w.submit(answer(l));
  REQUIRE(w.flush(10));
  auto batch = learner.next_batch({.max_groups = 2}, 10);
  CHECK(batch.groups.size() == 2);
}

TEST_CASE("client: a request gives up as soon as give_up_when says so, not at its timeout", "[bus][client]") {
  TempDir dir;
  // Nobody serves this address: the request waits, then gives up.
  Client c({.address = "ipc://" + (dir.path / "nobody.sock").string(), .who = "w", .request_timeout_s = 60});
  std::atomic<bool> gone{false};
  c.give_up_when([&] { return gone.load(); });
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gone = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto err = rlx::test::error_of([&] { (void)c.request_leases(1); });
  later.join();
  CHECK_THAT(err, Contains("gave up waiting for the hub's answer to lease_request"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  CHECK(c.close(0.1));  // the forgotten request is not pending: close returns at once
}

TEST_CASE("client: submit waiting for credit gives up as soon as give_up_when says so, not at credit_wait_s",
          "[bus][client]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.replay.capacity_groups = 2;  // no learner drains it: after two groups, no more credit
  o.credits_per_peer = 2;
  HubThread h(o, prompts(8));
  auto wo = worker(o.address, "w0");
  wo.credit_wait_s = 60;
  Client w(wo);
  std::atomic<bool> stopped{false};
  w.give_up_when([&] { return stopped.load(); });
  auto grant = w.request_leases(4);
  REQUIRE(grant.leases.size() == 4);
  for (int i = 0; i < 3; ++i) w.submit(answer(grant.leases[static_cast<size_t>(i)]));  // the third waits behind credit
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto err = rlx::test::error_of([&] { w.submit(answer(grant.leases[3])); });
  later.join();
  CHECK_THAT(err, Contains("gave up waiting for credit from the hub; lease " + std::to_string(grant.leases[3].lease_id)));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  CHECK(w.counters().credit_waits == 1);
  CHECK(w.counters().verdicts["accepted"] == 2);
  w.close(0.1);
}

TEST_CASE("bus: a worker that closes says goodbye, the hub re-issues its open leases at once, not after peer_timeout_s",
          "[bus][client]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.peer_timeout_s = 60;
  o.lease_timeout_s = 120;
  HubThread h(o, prompts(4));
  Client monitor({.address = o.address, .who = "m", .role = "monitor"});
  std::vector<uint64_t> held;
  {
    Client w(worker(o.address, "w0"));
    auto grant = w.request_leases(4);
    REQUIRE(grant.leases.size() == 4);
    w.submit(answer(grant.leases[0]));
    for (size_t i = 1; i < 4; ++i) held.push_back(grant.leases[i].lease_id);
    CHECK(stat(monitor.hub_stats(), "peers_connected") == 2);
    CHECK(w.close(10));
    CHECK_THAT(rlx::test::error_of([&] { (void)w.request_leases(1); }), Contains("client w0: closed"));
    CHECK(w.close(10));  // a second close returns at once
  }
  const auto after = monitor.hub_stats();
  CHECK(stat(after, "peers_connected") == 1);  // the monitor
  CHECK(stat(after, "peers_left") == 1);
  CHECK(stat(after, "peers_lost") == 0);
  Client w1(worker(o.address, "w1"));
  const auto t0 = std::chrono::steady_clock::now();
  auto again = w1.request_leases(4);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  std::vector<uint64_t> got;
  for (const auto& l : again.leases) got.push_back(l.lease_id);
  CHECK(got.size() == 3);
  for (auto id : held) CHECK(std::find(got.begin(), got.end(), id) != got.end());
}

TEST_CASE("bus: a learner's batch carries each group's frame as its worker sent it", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  HubThread h(o, prompts(4));
  Client w(worker(o.address, "w0"));
  auto grant = w.request_leases(2);  // the worker's frames: hello 1, lease request 2
  REQUIRE(grant.leases.size() == 2);
  std::vector<TrajectoryGroup> sent;
  for (const auto& l : grant.leases) {
    sent.push_back(answer(l, 3000));  // large frames (sent and forwarded without a copy)
    sent.back().worker = "w0";
    w.submit(sent.back());  // groups 3 and 4
  }
  REQUIRE(w.flush(10));
  RawLearner learner(o.address);
  const Limits limits;
  const auto text = RawLearner::text;
  CHECK(decode_frame(text(learner.ask(pack(Hello{"L", "learner", 1}, 1)).at(0)), limits).type == MsgType::welcome);
  auto parts = learner.ask(pack(BatchRequest{.max_groups = 2}, 2));
  REQUIRE(parts.size() == 3);
  const std::string head_bytes = text(parts[0]);
  const Frame head_frame = decode_frame(head_bytes, limits);
  CHECK(head_frame.seq == 2);
  const auto head = unpack<BatchHead>(head_frame, limits);
  CHECK(head.groups == 2);
  for (size_t i = 0; i < 2; ++i) {
    const std::string bytes = text(parts[i + 1]);
    const Frame f = decode_frame(bytes, limits);  // the worker's checksum, checked here
    CHECK(f.seq == 3 + i);                         // the worker's sequence number: not re-packed
    CHECK(bytes == pack(sent[i], 3 + i));
  }
}

TEST_CASE("bus: a learner reads batches in place, each stays valid while it is kept, and can be handed on", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  HubThread h(o, prompts(4));
  Client w(worker(o.address, "w0"));
  std::map<uint64_t, TrajectoryGroup> sent;
  for (const auto& l : w.request_leases(4).leases) {
    auto g = answer(l, 3000);
    g.worker = "w0";
    sent[l.lease_id] = g;
    w.submit(g);
  }
  REQUIRE(w.flush(10));
  Client learner({.address = o.address, .who = "L", .role = "learner", .request_timeout_s = 10});
  const BatchView first = learner.next_batch_view({.max_groups = 2}, 10);
  const BatchView second = learner.next_batch_view({.max_groups = 2}, 10);  // more frames arrive meanwhile
  std::set<uint64_t> seen;
  for (const BatchView* b : {&first, &second}) {
    REQUIRE(b->groups.size() == 2);
    REQUIRE(b->frames.size() == 2);
    for (const auto& g : b->groups) {
      REQUIRE(sent.count(g.lease_id) == 1);
      CHECK(to_group(g) == sent[g.lease_id]);  // the first batch's bytes are still its own
      seen.insert(g.lease_id);
    }
  }
  CHECK(seen.size() == 4);
  CHECK(first.copy().groups.size() == 2);
  // Handed to another process (a learner's other ranks) as one string, and read back.
  const BatchView again = unpack_batch(std::make_shared<const std::string>(pack_batch(second)), Limits{});
  CHECK(again.batch_id == second.batch_id);
  CHECK(again.end == second.end);
  CHECK(again.copy() == second.copy());
}

TEST_CASE("bus: a learner holds at most one batch ahead, a batch it never got is sent again", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  HubThread h(o, prompts(8));
  submit_all(o.address, 8);
  // Every request names the newest batch trained (ack) and the newest received (have).
  RawLearner learner(o.address);
  const Limits limits;
  const auto text = RawLearner::text;
  uint64_t seq = 0;
  auto ask = [&](const auto& msg) { return learner.ask(pack(msg, ++seq)); };
  struct Got {
    uint64_t batch_id = 0;
    std::vector<uint64_t> prompts;
    std::string refused;
  };
  auto batch = [&](uint64_t ack, uint64_t have) {
    const auto parts = ask(BatchRequest{.max_groups = 2, .ack_batch_id = ack, .have_batch_id = have});
    const std::string head_bytes = text(parts.at(0));
    const Frame f = decode_frame(head_bytes, limits);
    Got g;
    if (f.type == MsgType::ack) {
      g.refused = unpack<Ack>(f, limits).verdict;
      return g;
    }
    g.batch_id = unpack<BatchHead>(f, limits).batch_id;
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string bytes = text(parts[i]);
      g.prompts.push_back(unpack<TrajectoryGroup>(decode_frame(bytes, limits), limits).prompt_index);
    }
    return g;
  };
  (void)ask(Hello{"L", "learner", 1});
  const Got b1 = batch(0, 0);
  REQUIRE(b1.batch_id == 1);
  REQUIRE(b1.prompts.size() == 2);
  const Got b2 = batch(0, 1);  // ahead: batch 1 is being trained
  REQUIRE(b2.batch_id == 2);
  // A third unconfirmed batch is refused, naming the two held.
  CHECK_THAT(batch(0, 2).refused, Contains("holding 2 it has not confirmed (batches 1 and 2)"));
  // Batch 1 trained, batch 2's reply lost (have 1): the same batch 2 comes again.
  const Got again = batch(1, 1);
  CHECK(again.batch_id == 2);
  CHECK(again.prompts == b2.prompts);
  CHECK_THAT(batch(3, 2).refused, Contains("confirms batch 3 but has only received up to 2"));
  const Got b3 = batch(1, 2);
  CHECK(b3.batch_id == 3);
  const Got b4 = batch(2, 3);
  CHECK(b4.batch_id == 4);
  // Every group exactly once across the batches (batch 2 counted once).
  std::vector<uint64_t> all;
  for (const Got* g : {&b1, &b2, &b3, &b4}) all.insert(all.end(), g->prompts.begin(), g->prompts.end());
  std::sort(all.begin(), all.end());
  CHECK((all == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  Client monitor({.address = o.address, .who = "m", .role = "monitor"});
  CHECK(stat(monitor.hub_stats(), "batches_resent") == 1);
}

TEST_CASE("bus: a learner's CheckpointSaved confirms its batch and saves the hub beside its state file", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.state_file = (dir / "state.bin").string();
  HubThread h(o, prompts(8));
  submit_all(o.address, 8);
  Client learner({.address = o.address, .who = "L", .role = "learner", .request_timeout_s = 10});
  const auto b1 = learner.next_batch({.max_groups = 2}, 10);
  const auto b2 = learner.next_batch({.max_groups = 2}, 10);  // confirms b1
  REQUIRE(b2.batch_id > b1.batch_id);
  learner.checkpoint_saved("hub-step_00000002.state", b2.batch_id);
  const auto saved = read_snapshot((dir / "hub-step_00000002.state").string());
  CHECK(saved.in_flight.empty());  // both batches confirmed by the checkpoint
  CHECK(saved.buffer.size() == 4);
  // Only a learner checkpoints, only to a plain file name beside the state file.
  Client monitor({.address = o.address, .who = "m", .role = "monitor"});
  CHECK_THAT(rlx::test::error_of([&] { monitor.checkpoint_saved("hub-step_00000003.state", 0); }),
             Contains("checkpoint_saved from m, a monitor: only learners checkpoint"));
  for (const char* bad : {"../state.bin", ".hidden", "a/b", ""})
    CHECK_THAT(rlx::test::error_of([&] { learner.checkpoint_saved(bad, b2.batch_id); }),
               Contains("is not a plain file name"));
  CHECK_FALSE(std::filesystem::exists(dir / "hub-step_00000003.state"));
}

TEST_CASE("bus: a prefetching learner gets every group once, and its restart returns both unconfirmed batches", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.state_file = (dir / "state.bin").string();
  HubThread h(o, prompts(12));
  submit_all(o.address, 12);
  ClientOptions lo{.address = o.address, .who = "L", .role = "learner", .incarnation = 1, .request_timeout_s = 10,
                   .prefetch_batches = 1};
  std::vector<uint64_t> first, second;
  Client monitor({.address = o.address, .who = "m", .role = "monitor"});
  {
    Client learner(lo);
    for (const auto& g : learner.next_batch({.max_groups = 2}, 10).groups) first.push_back(g.prompt_index);
    for (const auto& g : learner.next_batch({.max_groups = 2}, 10).groups) second.push_back(g.prompt_index);
    CHECK_THAT(rlx::test::error_of([&] { (void)learner.next_batch({.max_groups = 3}, 10); }),
               Contains("keep the request the same, or set prefetch_batches to 0"));
    // Batch 1 is confirmed; batch 2 is being trained and batch 3 was asked for ahead.
    for (int i = 0; i < 200 && stat(monitor.hub_stats(), "batches_sent") < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(stat(monitor.hub_stats(), "batches_sent") == 3);
    monitor.control(ControlCommand::save);
    const auto saved = read_snapshot(o.state_file);
    REQUIRE(saved.in_flight.size() == 2);
    CHECK(saved.in_flight[0].batch.batch_id == 2);
    CHECK(saved.in_flight[1].batch.batch_id == 3);
  }
  // The learner restarts (a new incarnation): batches 2 and 3 go back to the buffer, in
  // order, and nothing is lost or repeated.
  lo.incarnation = 2;
  Client learner(lo);
  std::vector<uint64_t> after;
  for (int i = 0; i < 5; ++i)
    for (const auto& g : learner.next_batch({.max_groups = 2}, 10).groups) after.push_back(g.prompt_index);
  CHECK((std::vector<uint64_t>(after.begin(), after.begin() + 2) == second));
  std::vector<uint64_t> all = first;
  all.insert(all.end(), after.begin(), after.end());
  std::sort(all.begin(), all.end());
  std::vector<uint64_t> expected(12);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(all == expected);
  CHECK(stat(monitor.hub_stats(), "batches_requeued") == 2);
}

TEST_CASE("bus: acks held for ack_delay_ms go out when it passes, with no other traffic", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.credits_per_peer = 8;  // acks go early once 4 wait; here 1 does
  o.ack_delay_ms = 100;
  o.heartbeat_s = 30;  // no heartbeat flushes them either
  o.peer_timeout_s = 60;
  HubThread h(o, prompts(4));
  auto wo = worker(o.address, "w0");
  wo.heartbeat_s = 30;
  wo.hub_timeout_s = 60;
  Client w(wo);
  auto grant = w.request_leases(1);
  REQUIRE(grant.leases.size() == 1);
  w.submit(answer(grant.leases[0]));
  CHECK(w.flush(5));
  CHECK(w.counters().verdicts["accepted"] == 1);
}

TEST_CASE("bus: a batch asked ahead holds only groups within max_staleness of the version it will be trained with",
          "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.replay.max_staleness = 1;
  HubThread h(o, prompts(6));
  Client w(worker(o.address, "w0"));
  const auto leases = w.request_leases(6).leases;
  REQUIRE(leases.size() == 6);
  auto at_version = [](TrajectoryGroup g, int64_t v) {
    for (auto& s : g.samples) {
      auto per_token = s.versions.per_token();
      for (auto& x : per_token)
        if (x >= 0) x = v;
      s.versions = TokenVersions(per_token);
    }
    return g;
  };
  Client learner({.address = o.address, .who = "L", .role = "learner", .request_timeout_s = 10, .prefetch_batches = 1});
  learner.publish_version(1);
  for (size_t i = 0; i < 4; ++i) w.submit(at_version(answer(leases[i]), 0));  // lag 1 now: fresh
  REQUIRE(w.flush(10));
  // Batch 1 is trained after version 1; the batch asked ahead with it, after version 2, when
  // the two groups of version 0 left are two versions old: it waits for fresher ones.
  const auto b1 = learner.next_batch({.max_groups = 2}, 10);
  REQUIRE(b1.groups.size() == 2);
  for (size_t i = 4; i < 6; ++i) w.submit(at_version(answer(leases[i]), 1));
  REQUIRE(w.flush(10));
  learner.publish_version(2);
  const auto b2 = learner.next_batch({.max_groups = 2}, 10);
  REQUIRE(b2.groups.size() == 2);
  for (const auto& g : b2.groups) {
    CHECK(g.version_range().first == 1);  // lag 1 at version 2, not 2
    CHECK((g.lease_id == leases[4].lease_id || g.lease_id == leases[5].lease_id));
  }
  Client monitor({.address = o.address, .who = "m", .role = "monitor"});
  CHECK(stat(monitor.hub_stats(), "replay_evicted_stale") == 2);  // the version-0 pair
}

namespace {
// The VmFlags of the mapping of this process that holds `address` ("" when none does).
std::string vm_flags_at(uintptr_t address) {
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find('-') < line.find(' ')) inside = from <= address && address < to;
    else if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}
}  // namespace

TEST_CASE("bus: keep_frame_memory leaves a heap top of huge pages for the frames", "[bus]") {
  // A process calls it first, before its heap is in use (the roles do); the tests before
  // this one leave the heap of this process fragmented. So the checks run in a fresh copy of
  // this test binary, which runs this test alone.
  if (!std::getenv("RLX_TEST_FRESH_PROCESS")) {
    const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string command = "env -u RLX_NO_HUGE_HEAP RLX_TEST_FRESH_PROCESS=1 '" + self +
                                "' 'bus: keep_frame_memory leaves a heap top of huge pages for the frames' 2>&1";
    FILE* child = ::popen(command.c_str(), "r");
    REQUIRE(child);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, child)) > 0;) out.append(buf, n);
    INFO(out);
    CHECK(::pclose(child) == 0);
    CHECK_THAT(out, Contains("All tests passed"));
    return;
  }
  keep_frame_memory();
  keep_frame_memory();  // once only: a second call grows nothing
  // The top chunk, where frames larger than any free chunk come from, is at least most of
  // the 512 MiB pad, and its pages are advised huge ("hg").
  CHECK(::mallinfo2().keepcost >= (size_t{256} << 20));
  const auto top = reinterpret_cast<uintptr_t>(::sbrk(0)) - 1;
  CHECK_THAT(vm_flags_at(top), Contains(" hg"));
  CHECK_THAT(vm_flags_at(top - (size_t{128} << 20)), Contains(" hg"));
  // A frame from there.
  std::vector<char> frame(size_t{300} << 20);  // larger than any chunk freed before
  frame.back() = 1;
  CHECK_THAT(vm_flags_at(reinterpret_cast<uintptr_t>(frame.data() + frame.size() / 2)), Contains(" hg"));
}

TEST_CASE("bus: while a worker's groups stream in, the hub waits between turns to take several per wake-up", "[bus]") {
  TempDir dir;
  auto o = options(dir, "hub");
  o.credits_per_peer = 16;
  o.replay.capacity_groups = 300;
  o.max_leases_per_request = 200;
  o.coalesce_us = 2000;
  HubThread h(o, prompts(200));
  Client w(worker(o.address, "w0"));
  const auto grant = w.request_leases(120);
  REQUIRE(grant.leases.size() == 120);
  for (const auto& l : grant.leases) w.submit(answer(l, 2000));
  CHECK(w.flush(30));
  CHECK(w.counters().verdicts["accepted"] == 120);  // none lost, none refused for credit
  const auto s = h.hub.stats();
  CHECK(stat(s, "groups_accepted") == 120);
  CHECK(stat(s, "coalesce_waits") >= 1);
  // Two workers at once: each one's pace bounds the wait; every group still accepted.
  Client wa(worker(o.address, "wa")), wb(worker(o.address, "wb"));
  std::vector<Lease> la, lb;
  for (int i = 0; i < 40; ++i) {
    if (la.empty()) la = wa.request_leases(20).leases;
    if (lb.empty()) lb = wb.request_leases(20).leases;
    REQUIRE((!la.empty() && !lb.empty()));
    wa.submit(answer(la.back(), 2000)), la.pop_back();
    wb.submit(answer(lb.back(), 2000)), lb.pop_back();
  }
  CHECK(wa.flush(30));
  CHECK(wb.flush(30));
  CHECK(wa.counters().verdicts["accepted"] + wb.counters().verdicts["accepted"] == 80);
  CHECK(stat(h.hub.stats(), "coalesce_waits") > stat(s, "coalesce_waits"));
  // Off: no waits.
  TempDir dir2;
  auto o2 = options(dir2, "hub2");
  o2.coalesce_us = 0;
  HubThread h2(o2, prompts(8));
  Client w2(worker(o2.address, "w1"));
  for (const auto& l : w2.request_leases(8).leases) w2.submit(answer(l, 2000));
  CHECK(w2.flush(30));
  CHECK(stat(h2.hub.stats(), "coalesce_waits") == 0);
  CHECK(stat(h2.hub.stats(), "groups_accepted") == 8);
}
