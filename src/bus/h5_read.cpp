// Reading trajectory files (h5store.hpp): groups, a file's summary, and the upgrade of
// older formats.
#include <hdf5.h>

#include <string>
#include <vector>

#include "h5_columns.hpp"
#include "rlx/bus/h5store.hpp"
#include "rlx/core/error.hpp"

namespace rlx::bus {

using namespace h5;

namespace {
// Sample `sample`'s per-token versions from its runs [first, first + count) of the columns
// `values` (run_version) and `lengths` (run_length), checked against its `tokens`.
TokenVersions read_versions(const Column& values_col, const Column& lengths_col, const std::string& path, int64_t first,
                            int64_t count, uint64_t tokens, uint64_t sample) {
  RLX_CHECK(first >= 0 && count >= 0, "{}: sample {}: runs from {}, {} of them", path, sample, first, count);
  const auto values = values_col.read<int64_t>(static_cast<uint64_t>(first), static_cast<uint64_t>(count), path);
  const auto lengths = lengths_col.read<uint32_t>(static_cast<uint64_t>(first), static_cast<uint64_t>(count), path);
  try {
    return TokenVersions::from(VersionRuns::checked({reinterpret_cast<const char*>(values.data()), values.size()},
                                                    {reinterpret_cast<const char*>(lengths.data()), lengths.size()}, tokens));
  } catch (const FrameError& e) {
    throw Error(fmt::format("{}: sample {}: {}", path, sample, e.what()));
  }
}

// Sample `sample`'s routing: its dimensions, and its tokens x layers x top_k values of
// /routing from `first`.
TokenRouting read_routing(const Columns& c, int64_t first, uint16_t layers, uint16_t top_k, uint64_t tokens, uint64_t sample) {
  const uint64_t n = tokens * layers * top_k;
  RLX_CHECK(first >= 0 && static_cast<uint64_t>(first) + n <= c.routing.extent, "{}: sample {}: routing from {}, {} values, "
            "past /routing's {}", c.path, sample, first, n, c.routing.extent);
  TokenRouting r{.layers = n ? layers : uint16_t{0}, .top_k = n ? top_k : uint16_t{0}};
  r.experts = c.routing.read<int16_t>(static_cast<uint64_t>(first), n, c.path);
  return r;
}

// Groups [first, first + count) of an open file (count clipped to its whole groups).
std::vector<TrajectoryGroup> read_groups(const Columns& c, uint64_t first, uint64_t count, uint64_t total) {
  if (first >= total) return {};
  count = std::min(count, total - first);
  const auto lease = c.lease_id.read<uint64_t>(first, count, c.path);
  const auto prompt = c.prompt_index.read<uint64_t>(first, count, c.path);
  const auto epoch = c.epoch.read<uint64_t>(first, count, c.path);
  const auto fs = c.first_sample.read<int64_t>(first, count, c.path);
  const auto ns = c.num_samples.read<int64_t>(first, count, c.path);
  const auto worker = c.read_strings(c.worker, first, count);
  std::vector<TrajectoryGroup> out(count);
  for (uint64_t i = 0; i < count; ++i) {
    auto& g = out[i];
    g.lease_id = lease[i], g.prompt_index = prompt[i], g.epoch = epoch[i], g.worker = worker[i];
    const auto s0 = static_cast<uint64_t>(fs[i]), sn = static_cast<uint64_t>(ns[i]);
    const auto off = c.sample_offset.read<int64_t>(s0, sn, c.path);
    const auto len = c.sample_length.read<int64_t>(s0, sn, c.path);
    const auto plen = c.prompt_len.read<int32_t>(s0, sn, c.path);
    const auto rew = c.reward.read<float>(s0, sn, c.path);
    const auto fin = c.read_strings(c.finish, s0, sn);
    const auto meta = c.read_strings(c.metadata, s0, sn);
    const auto r0 = c.first_run.read<int64_t>(s0, sn, c.path), rn = c.num_runs.read<int64_t>(s0, sn, c.path);
    std::vector<int64_t> e0;
    std::vector<uint16_t> el, ek;
    if (c.has_routing) {
      e0 = c.routing_offset.read<int64_t>(s0, sn, c.path);
      el = c.routing_layers.read<uint16_t>(s0, sn, c.path), ek = c.routing_top_k.read<uint16_t>(s0, sn, c.path);
    }
    for (uint64_t j = 0; j < sn; ++j) {
      Trajectory t;
      const auto o = static_cast<uint64_t>(off[j]), n = static_cast<uint64_t>(len[j]);
      t.tokens = c.tokens.read<int32_t>(o, n, c.path);
      t.loss_mask = c.loss_mask.read<uint8_t>(o, n, c.path);
      t.logprobs = c.logprobs.read<float>(o, n, c.path);
      t.versions = read_versions(c.run_version, c.run_length, c.path, r0[j], rn[j], n, s0 + j);
      t.prompt_len = plen[j], t.reward = rew[j], t.finish = fin[j], t.metadata = meta[j];
      if (c.has_routing) t.routing = read_routing(c, e0[j], el[j], ek[j], n, s0 + j);
      g.samples.push_back(std::move(t));
    }
  }
  return out;
}
}  // namespace

std::vector<TrajectoryGroup> read_trajectory_groups(const std::filesystem::path& file, uint64_t first, uint64_t count) {
  Columns c;
  c.open(file, /*writable=*/false);
  return read_groups(c, first, count, c.whole().groups);
}

TrajectoryFileSummary summarize_trajectories(const std::filesystem::path& file) {
  Columns c;
  c.open(file, /*writable=*/false);
  TrajectoryFileSummary s;
  const auto n = c.whole();
  s.groups = n.groups, s.samples = n.samples, s.tokens = n.tokens;
  const auto rewards = c.reward.read<float>(0, s.samples, c.path);
  if (!rewards.empty()) {
    double sum = 0;
    s.reward_min = std::numeric_limits<double>::infinity(), s.reward_max = -s.reward_min;
    for (float r : rewards) sum += r, s.reward_min = std::min<double>(s.reward_min, r), s.reward_max = std::max<double>(s.reward_max, r);
    s.reward_mean = sum / static_cast<double>(rewards.size());
  }
  constexpr uint64_t kStrings = 4096;  // a group's text at a time: bounded memory (metadata may be long)
  for (uint64_t at = 0; at < s.samples; at += kStrings)
    for (const auto& f : c.read_strings(c.finish, at, std::min(kStrings, s.samples - at))) {
      if (s.finish.size() < 1000 || s.finish.count(f)) ++s.finish[f];  // bounded: a reason per sample would be none
      else ++s.finish["(other)"];
    }
  for (uint64_t at = 0; at < s.groups; at += kStrings)
    for (const auto& w : c.read_strings(c.worker, at, std::min(kStrings, s.groups - at))) ++s.workers[w];
  const auto leases = c.lease_id.read<uint64_t>(0, s.groups, c.path);
  const auto prompts = c.prompt_index.read<uint64_t>(0, s.groups, c.path);
  s.distinct_leases = std::set<uint64_t>(leases.begin(), leases.end()).size();
  s.distinct_prompts = std::set<uint64_t>(prompts.begin(), prompts.end()).size();
  constexpr uint64_t kChunk = uint64_t{1} << 20;  // bounded memory for any file size
  for (uint64_t at = 0; at < s.tokens; at += kChunk) {
    const uint64_t k = std::min(kChunk, s.tokens - at);
    for (uint8_t m : c.loss_mask.read<uint8_t>(at, k, c.path)) s.policy_tokens += m != 0;
  }
  for (uint64_t at = 0; at < n.runs; at += kChunk) {
    for (int64_t v : c.run_version.read<int64_t>(at, std::min(kChunk, n.runs - at), c.path)) {
      if (v < 0) continue;
      s.version_min = s.version_min < 0 ? v : std::min(s.version_min, v);
      s.version_max = std::max(s.version_max, v);
    }
  }
  return s;
}

namespace {
// A column of a format 1 or 2 file, opened by name; `type` is also what it is read as.
Column legacy_column(const Handle& file, const std::string& path, const char* name, hid_t type) {
  Column c;
  c.name = name, c.file_type = type;
  c.ds = Handle(H5Dopen2(file.get(), name, H5P_DEFAULT), H5Dclose);
  RLX_CHECK(c.ds, "{}: dataset /{} is missing", path, name);
  c.extent = c.size();
  return c;
}
// Entries of an HDF5 variable-length string column (`c.file_type` the string type).
std::vector<std::string> legacy_strings(const Column& c, uint64_t start, uint64_t count, const std::string& path) {
  auto raw = c.read<char*>(start, count, path);
  std::vector<std::string> out;
  out.reserve(count);
  for (char* p : raw) out.emplace_back(p ? p : "");
  if (count) {
    const hsize_t n = count;
    Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5Dvlen_reclaim(c.file_type, mspace.get(), H5P_DEFAULT, raw.data());
  }
  return out;
}
}  // namespace

uint64_t upgrade_trajectories(const std::filesystem::path& from, const std::filesystem::path& to) {
  quiet_hdf5();
  const std::string path = from.string();
  RLX_CHECK(std::filesystem::exists(from), "trajectory file {} does not exist", path);
  RLX_CHECK(H5Fis_hdf5(path.c_str()) > 0, "{} is not an HDF5 file", path);
  RLX_CHECK(!std::filesystem::exists(to), "{} exists: the upgrade writes a new file", to.string());
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  RLX_CHECK(file, "cannot open {}{}", path, hdf5_reason());
  const int version = Columns::format_version(file, path);
  RLX_CHECK(version >= 1 && version <= 3, "{}: trajectory format version {}, {}", path, version,
            version == kFormatVersion ? "this build's already" : "which this build cannot upgrade (it upgrades 1 to 3)");
  if (version == 3) {  // this format without routing: its groups as they read, none routed
    file.reset();
    Columns c;
    c.open(from, /*writable=*/false, /*format=*/3);
    const uint64_t groups = c.whole().groups;
    TrajectoryStore out(to);
    constexpr uint64_t kBatch = 64;  // groups read at a time: bounded memory
    for (uint64_t g0 = 0; g0 < groups; g0 += kBatch) {
      const auto batch = read_groups(c, g0, kBatch, groups);
      const auto accepted = c.accepted_version.read<int64_t>(g0, batch.size(), path);
      for (size_t i = 0; i < batch.size(); ++i)
        RLX_CHECK(out.append(batch[i], accepted[i]), "{}: cannot write group {}: {}", to.string(), g0 + i, out.last_error());
    }
    out.flush();
    return out.groups();
  }
  Handle str(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(str.get(), H5T_VARIABLE);
  const auto col = [&](const char* name, hid_t type) { return legacy_column(file, path, name, type); };
  const Column lease = col("group_lease_id", H5T_NATIVE_UINT64), prompt = col("group_prompt_index", H5T_NATIVE_UINT64),
               epoch = col("group_epoch", H5T_NATIVE_UINT64), first = col("group_first_sample", H5T_NATIVE_INT64),
               count = col("group_num_samples", H5T_NATIVE_INT64), worker = col("group_worker", str.get()),
               accepted = col("group_accepted_version", H5T_NATIVE_INT64);
  const Column offset = col("sample_offset", H5T_NATIVE_INT64), length = col("sample_length", H5T_NATIVE_INT64),
               prompt_len = col("prompt_len", H5T_NATIVE_INT32), reward = col("reward", H5T_NATIVE_FLOAT),
               finish = col("finish", str.get()), metadata = col("metadata", str.get());
  const Column tokens = col("tokens", H5T_NATIVE_INT32), mask = col("loss_mask", H5T_NATIVE_UINT8),
               logprobs = col("logprobs", H5T_NATIVE_FLOAT);
  std::optional<Column> versions, first_run, num_runs, run_version, run_length;  // 1: per token; 2: runs
  if (version == 1) {
    versions = col("versions", H5T_NATIVE_INT64);
  } else {
    first_run = col("sample_first_run", H5T_NATIVE_INT64), num_runs = col("sample_num_runs", H5T_NATIVE_INT64);
    run_version = col("run_version", H5T_NATIVE_INT64), run_length = col("run_length", H5T_NATIVE_UINT32);
  }
  uint64_t groups = ~uint64_t{0};
  for (const Column* c : {&lease, &prompt, &epoch, &first, &count, &worker, &accepted}) groups = std::min(groups, c->extent);
  uint64_t samples = ~uint64_t{0};
  for (const Column* c : {&offset, &length, &prompt_len, &reward, &finish, &metadata}) samples = std::min(samples, c->extent);
  if (first_run) samples = std::min({samples, first_run->extent, num_runs->extent});
  const uint64_t token_count = std::min({tokens.extent, mask.extent, logprobs.extent, versions ? versions->extent : ~uint64_t{0}});

  TrajectoryStore out(to);
  constexpr uint64_t kBatch = 64;  // groups read at a time: bounded memory
  for (uint64_t g0 = 0; g0 < groups; g0 += kBatch) {
    const uint64_t n = std::min(kBatch, groups - g0);
    const auto l = lease.read<uint64_t>(g0, n, path), p = prompt.read<uint64_t>(g0, n, path), e = epoch.read<uint64_t>(g0, n, path);
    const auto f = first.read<int64_t>(g0, n, path), c = count.read<int64_t>(g0, n, path), a = accepted.read<int64_t>(g0, n, path);
    const auto w = legacy_strings(worker, g0, n, path);
    for (uint64_t i = 0; i < n; ++i) {
      // A torn tail (a writer killed past its last flush): the groups before it are kept.
      const auto s0 = static_cast<uint64_t>(f[i]), sn = static_cast<uint64_t>(c[i]);
      if (f[i] < 0 || c[i] < 1 || s0 + sn > samples) {
        log::warn("{}: group {} of {} is not whole (a writer stopped uncleanly): upgraded the {} before it", path, g0 + i, groups,
                  g0 + i);
        out.flush();
        return out.groups();
      }
      TrajectoryGroup g{.lease_id = l[i], .prompt_index = p[i], .epoch = e[i], .worker = w[i]};
      const auto off = offset.read<int64_t>(s0, sn, path), len = length.read<int64_t>(s0, sn, path);
      const auto plen = prompt_len.read<int32_t>(s0, sn, path);
      const auto rew = reward.read<float>(s0, sn, path);
      const auto fin = legacy_strings(finish, s0, sn, path), meta = legacy_strings(metadata, s0, sn, path);
      std::vector<int64_t> r0, rn;
      if (first_run) r0 = first_run->read<int64_t>(s0, sn, path), rn = num_runs->read<int64_t>(s0, sn, path);
      for (uint64_t j = 0; j < sn; ++j) {
        const auto o = static_cast<uint64_t>(off[j]), k = static_cast<uint64_t>(len[j]);
        RLX_CHECK(off[j] >= 0 && len[j] >= 0 && o + k <= token_count, "{}: sample {} points past the tokens", path, s0 + j);
        Trajectory t;
        t.tokens = tokens.read<int32_t>(o, k, path);
        t.loss_mask = mask.read<uint8_t>(o, k, path);
        t.logprobs = logprobs.read<float>(o, k, path);
        t.versions = versions ? TokenVersions(versions->read<int64_t>(o, k, path))
                              : read_versions(*run_version, *run_length, path, r0[j], rn[j], k, s0 + j);
        t.prompt_len = plen[j], t.reward = rew[j], t.finish = fin[j], t.metadata = meta[j];
        g.samples.push_back(std::move(t));
      }
      RLX_CHECK(out.append(g, a[i]), "{}: cannot write group {}: {}", to.string(), g0 + i, out.last_error());
    }
  }
  out.flush();
  return out.groups();
}

}  // namespace rlx::bus
