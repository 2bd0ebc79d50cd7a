#include "rlx/bus/h5store.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstring>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "h5_columns.hpp"

namespace rlx::bus {

using namespace h5;


// Appends wait here, one buffer per column, and go to the file together once they hold
// StoreOptions::stage_bytes (and on flush, truncate and close): 24 columns written per group
// cost the hub more than receiving the group (`rlx bench bus --store`). Nothing is lost that
// was not lost before: HDF5 too held appends in memory until a flush, and a restored hub
// truncates the file to the count of its last save, which flushes.
struct Stage {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<float> logprobs;
  std::vector<int64_t> run_version, offset, length, first_run, num_runs;
  std::vector<uint32_t> run_length;
  std::vector<int32_t> prompt_len;
  std::vector<float> reward;
  std::vector<char> text;
  std::vector<int64_t> finish_offset, metadata_offset, worker_offset;
  std::vector<uint32_t> finish_length, metadata_length, worker_length;
  std::vector<uint64_t> lease_id, prompt_index, epoch;
  std::vector<int64_t> first_sample, num_samples, accepted_version;
  std::vector<int16_t> routing;
  std::vector<int64_t> routing_offset;
  std::vector<uint16_t> routing_layers, routing_top_k;
  size_t bytes = 0;
  double since = 0;  // when the first group waiting was staged

  bool empty() const { return lease_id.empty(); }
  // Appends `str` to the text, which then ends at `at` (bytes in the file and staged).
  void add_text(std::string_view str, uint64_t& at, std::vector<int64_t>& offset, std::vector<uint32_t>& length) {
    offset.push_back(static_cast<int64_t>(at));
    length.push_back(static_cast<uint32_t>(str.size()));
    text.insert(text.end(), str.begin(), str.end());
    at += str.size();
  }
  void write_to(Columns& c) const {
    const std::string& f = c.path;
    c.tokens.append(tokens.data(), tokens.size(), f);
    c.loss_mask.append(mask.data(), mask.size(), f);
    c.logprobs.append(logprobs.data(), logprobs.size(), f);
    c.run_version.append(run_version.data(), run_version.size(), f);
    c.run_length.append(run_length.data(), run_length.size(), f);
    c.sample_offset.append(offset.data(), offset.size(), f);
    c.sample_length.append(length.data(), length.size(), f);
    c.first_run.append(first_run.data(), first_run.size(), f);
    c.num_runs.append(num_runs.data(), num_runs.size(), f);
    c.prompt_len.append(prompt_len.data(), prompt_len.size(), f);
    c.reward.append(reward.data(), reward.size(), f);
    c.text.append(text.data(), text.size(), f);
    c.finish.offset.append(finish_offset.data(), finish_offset.size(), f);
    c.finish.length.append(finish_length.data(), finish_length.size(), f);
    c.metadata.offset.append(metadata_offset.data(), metadata_offset.size(), f);
    c.metadata.length.append(metadata_length.data(), metadata_length.size(), f);
    c.lease_id.append(lease_id.data(), lease_id.size(), f);
    c.prompt_index.append(prompt_index.data(), prompt_index.size(), f);
    c.epoch.append(epoch.data(), epoch.size(), f);
    c.first_sample.append(first_sample.data(), first_sample.size(), f);
    c.num_samples.append(num_samples.data(), num_samples.size(), f);
    c.accepted_version.append(accepted_version.data(), accepted_version.size(), f);
    c.worker.offset.append(worker_offset.data(), worker_offset.size(), f);
    c.worker.length.append(worker_length.data(), worker_length.size(), f);
    c.routing.append(routing.data(), routing.size(), f);
    c.routing_offset.append(routing_offset.data(), routing_offset.size(), f);
    c.routing_layers.append(routing_layers.data(), routing_layers.size(), f);
    c.routing_top_k.append(routing_top_k.data(), routing_top_k.size(), f);
  }
};

struct TrajectoryStore::Impl {
  WriterLock lock;
  std::filesystem::path path;
  StoreOptions options;
  Columns cols;
  Stage stage;
  uint64_t groups = 0, samples = 0, tokens = 0, runs = 0, text = 0, routing = 0;  // in the file and staged
  uint64_t committed = 0;  // the file's /committed: groups written and flushed
  uint64_t write_failures = 0;
  std::string last_error;  // of the last write; empty once one succeeds
  size_t retry_bytes = 0;  // after a failed write, appends try again once the stage holds this much

  // The disk space a write of the stage can take: its bytes, the chunks it starts (up to
  // 512 KiB per column) and the chunk index (generously).
  size_t space_needed() {
    return stage.bytes + stage.bytes / 4 + cols.all().size() * (size_t{512} << 10) + (size_t{4} << 20);
  }

  // Disk blocks for `bytes` past the end of HDF5's allocation, reserved before a write: a
  // write that fails half way leaves HDF5 with chunks it could not write in its cache and a
  // file it may not be able to close whole, so a full disk must be found before. A file
  // system that cannot reserve (posix_fallocate: EOPNOTSUPP) writes without.
  std::string reserve(size_t bytes) {
    haddr_t eoa = 0;
    void* handle = nullptr;
    if (H5Fget_eoa(cols.file.get(), &eoa) < 0 || H5Fget_vfd_handle(cols.file.get(), H5P_DEFAULT, &handle) < 0 || !handle)
      return fmt::format("{}: cannot find where the file ends{}", cols.path, hdf5_reason());
    const int rc = ::posix_fallocate(*static_cast<int*>(handle), static_cast<off_t>(eoa), static_cast<off_t>(bytes));
    if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL) return {};
    return fmt::format("{}: cannot reserve {:.1f} MiB for {} groups: {}", cols.path, static_cast<double>(bytes) / (1 << 20),
                       stage.lease_id.size(), std::strerror(rc));
  }

  // Writes the stage as one unit, after reserving the space it takes. When that fails (a
  // full disk, a file size limit) nothing is written and the stage is kept, to be written
  // again. Should a write fail past the reservation (an I/O error), every column is cut
  // back to its length before, as far as HDF5 still can. A failure is logged (the first
  // three, then at powers of two).
  bool write_stage() {
    if (stage.empty()) return commit();
    std::string error = reserve(space_needed());
    if (error.empty()) {
      std::vector<uint64_t> before;
      for (const Column* c : cols.all()) before.push_back(c->extent);
      try {
        stage.write_to(cols);
      } catch (const std::exception& e) {
        error = e.what();
        const auto all = cols.all();
        for (size_t i = 0; i < all.size(); ++i) {
          try {
            if (all[i]->extent != before[i]) all[i]->set_size(before[i], cols.path);
          } catch (const std::exception& cut) {
            error += fmt::format("; cutting /{} back failed too: {}", all[i]->name, cut.what());
          }
        }
      }
    }
    if (!error.empty()) return failed(std::move(error));
    stage = Stage{};
    return commit();
  }
  // Marks every group in the file as committed (readers see them), once they are.
  bool commit() {
    if (committed != groups) {
      try {
        cols.commit(groups);
      } catch (const std::exception& e) {
        return failed(e.what());
      }
      committed = groups;
    }
    if (!last_error.empty()) log::info("trajectory store {}: written again after {} failed writes", cols.path, write_failures);
    last_error.clear();
    return true;
  }
  bool failed(std::string error) {
    last_error = std::move(error);
    retry_bytes = stage.bytes + options.stage_bytes;
    const uint64_t n = ++write_failures;
    if (n <= 3 || (n & (n - 1)) == 0)
      log::warn("trajectory store: {} groups ({:.1f} MiB) wait to be written (failure {}): {}", groups - committed,
                static_cast<double>(stage.bytes) / (1 << 20), n, last_error);
    return false;
  }
};

TrajectoryStore::TrajectoryStore(const std::filesystem::path& file, StoreOptions options) : impl_(std::make_unique<Impl>()) {
  RLX_CHECK(options.stage_bytes > 0 && options.max_pending_bytes >= options.stage_bytes,
            "trajectory store: max_pending_bytes ({}) must be at least stage_bytes ({}) > 0", options.max_pending_bytes,
            options.stage_bytes);
  impl_->path = file;
  impl_->options = options;
  auto& c = impl_->cols;
  const bool existed = std::filesystem::exists(file);
  if (existed) impl_->lock = WriterLock(file);
  c.open(file, /*writable=*/true);
  if (!existed) impl_->lock = WriterLock(file);
  const auto n = c.whole();
  impl_->groups = n.groups, impl_->samples = n.samples, impl_->tokens = n.tokens, impl_->runs = n.runs, impl_->text = n.text;
  impl_->routing = n.routing;
  const auto had = c.lengths(/*longest=*/true);
  if (had.groups != n.groups || had.samples != n.samples || had.tokens != n.tokens || had.runs != n.runs || had.text != n.text ||
      had.routing != n.routing) {
    c.set_sizes(n);
    log::warn("trajectory store {}: its columns' lengths differed (a writer stopped uncleanly past its last flush): "
              "kept the {} whole groups ({} samples, {} tokens) of {} groups, {} samples, {} tokens", c.path, n.groups,
              n.samples, n.tokens, had.groups, had.samples, had.tokens);
  }
  c.commit(n.groups);
  impl_->committed = n.groups;
  c.start_swmr();
}

TrajectoryStore::~TrajectoryStore() {
  auto& c = impl_->cols;
  if (!impl_->write_stage())
    log::warn("trajectory store {}: {} groups staged at close were not written: {}", c.path, impl_->stage.lease_id.size(),
              impl_->last_error);
  // Closed, the file gives back the space reserved past HDF5's end of allocation (HDF5
  // leaves a longer file as it is). The end is read as HDF5 stored it, from the closed file.
  for (Column* col : c.all()) col->ds.reset();
  c.committed.reset();
  c.file.reset();
  haddr_t eoa = 0;
  if (Handle f(H5Fopen(c.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose); f && H5Fget_eoa(f.get(), &eoa) >= 0) {
    f.reset();
    std::error_code ec;
    if (eoa > 0 && std::filesystem::file_size(c.path, ec) > eoa && !ec) std::filesystem::resize_file(c.path, eoa, ec);
    if (ec) log::warn("trajectory store {}: cannot give back the space reserved past its end: {}", c.path, ec.message());
  }
  H5Eclear2(H5E_DEFAULT);
}

bool TrajectoryStore::append(const GroupView& g, int64_t accepted_version) {
  if (full()) return false;
  auto& st = impl_->stage;
  const int64_t first = static_cast<int64_t>(impl_->samples);
  int64_t at = static_cast<int64_t>(impl_->tokens);
  const size_t runs_before = st.run_version.size();
  constexpr size_t kMaxString = std::numeric_limits<uint32_t>::max();
  RLX_CHECK(g.worker.size() <= kMaxString, "lease {}: a worker name of {} bytes", g.lease_id, g.worker.size());
  for (const auto& s : g.samples) {
    const size_t n = s.tokens.size();
    RLX_CHECK(s.loss_mask.size() == n && s.logprobs.size() == n && s.versions.size() == n,
              "lease {}: a sample's tokens, loss_mask, logprobs and versions differ in length", g.lease_id);
    RLX_CHECK(s.finish.size() <= kMaxString && s.metadata.size() <= kMaxString,
              "lease {}: a sample's finish reason or metadata has over {} bytes", g.lease_id, kMaxString);
    RLX_CHECK(s.routing.experts.size() == (s.routing.empty() ? 0 : n * s.routing.per_token()),
              "lease {}: a sample's routing has {} values for {} tokens x {} sparse layers x top {}", g.lease_id,
              s.routing.experts.size(), n, s.routing.layers, s.routing.top_k);
  }
  if (st.empty()) st.since = now_s();
  const size_t text_before = st.text.size();
  st.add_text(g.worker, impl_->text, st.worker_offset, st.worker_length);
  for (const auto& s : g.samples) {
    const size_t n = s.tokens.size();
    s.tokens.append_to(st.tokens);
    s.loss_mask.append_to(st.mask);
    s.logprobs.append_to(st.logprobs);
    const size_t r = st.run_version.size();
    append_runs(s.versions, st.run_version, st.run_length);
    st.first_run.push_back(static_cast<int64_t>(impl_->runs + (r - runs_before)));
    st.num_runs.push_back(static_cast<int64_t>(st.run_version.size() - r));
    st.offset.push_back(at);
    st.length.push_back(static_cast<int64_t>(n));
    at += static_cast<int64_t>(n);
    st.prompt_len.push_back(s.prompt_len);
    st.reward.push_back(s.reward);
    st.add_text(s.finish, impl_->text, st.finish_offset, st.finish_length);
    st.add_text(s.metadata, impl_->text, st.metadata_offset, st.metadata_length);
    st.routing_offset.push_back(static_cast<int64_t>(impl_->routing));
    const bool routed = !s.routing.empty();
    st.routing_layers.push_back(routed ? s.routing.layers : uint16_t{0});
    st.routing_top_k.push_back(routed ? s.routing.top_k : uint16_t{0});
    s.routing.experts.append_to(st.routing);
    impl_->routing += s.routing.experts.size();
    st.bytes += n * (sizeof(int32_t) + sizeof(uint8_t) + sizeof(float)) + (st.run_version.size() - r) * 12 + 64 +
                s.routing.experts.size() * sizeof(int16_t);
  }
  st.bytes += st.text.size() - text_before + 64;
  st.lease_id.push_back(g.lease_id);
  st.prompt_index.push_back(g.prompt_index);
  st.epoch.push_back(g.epoch);
  st.first_sample.push_back(first);
  st.num_samples.push_back(static_cast<int64_t>(g.samples.size()));
  st.accepted_version.push_back(accepted_version);
  impl_->groups += 1;
  impl_->samples += g.samples.size();
  impl_->tokens = static_cast<uint64_t>(at);
  impl_->runs += st.run_version.size() - runs_before;
  // Once a write has failed, appends try again each time another stage_bytes have gathered.
  if (st.bytes >= (impl_->last_error.empty() ? impl_->options.stage_bytes : impl_->retry_bytes)) (void)impl_->write_stage();
  return true;
}

void TrajectoryStore::truncate(uint64_t groups) {
  auto& c = impl_->cols;
  if (groups >= impl_->groups) return;
  flush();
  uint64_t samples = 0, tokens = 0, runs = 0, text = 0, routing = 0;
  if (groups > 0) {
    const auto first = c.first_sample.read<int64_t>(groups, 1, c.path)[0];
    samples = static_cast<uint64_t>(first);
    tokens = static_cast<uint64_t>(c.sample_offset.read<int64_t>(samples, 1, c.path)[0]);
    runs = static_cast<uint64_t>(c.first_run.read<int64_t>(samples, 1, c.path)[0]);
    text = static_cast<uint64_t>(c.worker.offset.read<int64_t>(groups, 1, c.path)[0]);
    routing = static_cast<uint64_t>(c.routing_offset.read<int64_t>(samples, 1, c.path)[0]);
  }
  c.set_sizes({groups, samples, tokens, runs, text, routing});
  impl_->groups = groups, impl_->samples = samples, impl_->tokens = tokens, impl_->runs = runs, impl_->text = text;
  impl_->routing = routing;
  flush();
}

void TrajectoryStore::flush() {
  RLX_CHECK(impl_->write_stage(), "{} groups accepted since the last write are not in the file: {}",
            impl_->groups - impl_->committed, impl_->last_error);
}

bool TrajectoryStore::write_if_due() {
  const auto& st = impl_->stage;
  if (st.empty() || !impl_->last_error.empty() || now_s() - st.since < impl_->options.max_stage_age_s) return true;
  return impl_->write_stage();
}

bool TrajectoryStore::write_pending() { return impl_->write_stage(); }
bool TrajectoryStore::full() const { return impl_->stage.bytes >= impl_->options.max_pending_bytes; }
size_t TrajectoryStore::pending_bytes() const { return impl_->stage.bytes; }
uint64_t TrajectoryStore::write_failures() const { return impl_->write_failures; }
const std::string& TrajectoryStore::last_error() const { return impl_->last_error; }

uint64_t TrajectoryStore::groups() const { return impl_->groups; }
uint64_t TrajectoryStore::samples() const { return impl_->samples; }
uint64_t TrajectoryStore::tokens() const { return impl_->tokens; }
const std::filesystem::path& TrajectoryStore::path() const { return impl_->path; }

}  // namespace rlx::bus
