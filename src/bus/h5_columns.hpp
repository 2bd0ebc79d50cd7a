// The trajectory file's HDF5 layer, shared by its writer (h5store.cpp) and its readers
// (h5_read.cpp): handles closed by the right function, the writer's lock file, and the
// columns of the format (internal to src/bus).
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rlx/bus/h5store.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"

namespace rlx::bus::h5 {

constexpr const char* kFormat = "rlx-trajectories";
// 4: a sample's mixture-of-experts routing (/routing and its sample columns); 3: strings as
// bytes in /text, written for SWMR readers; 2: versions as runs (1: /versions int64 per token).
constexpr int kFormatVersion = 4;

// An HDF5 handle closed by the right function.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  ~Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// The one writer of a trajectory file: an open-file-description lock on the whole file,
// which the kernel drops when the process ends, however it ends (HDF5's own lock, flock,
// is let go once readers may come in).
class WriterLock {
 public:
  WriterLock() = default;
  explicit WriterLock(const std::filesystem::path& file) : fd_(::open(file.c_str(), O_RDWR | O_CLOEXEC)) {
    RLX_CHECK(fd_ >= 0, "cannot open {} for writing: {}", file.string(), std::strerror(errno));
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
    if (::fcntl(fd_, F_OFD_SETLK, &l) != 0) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      RLX_CHECK(e != EAGAIN && e != EACCES, "{} is being written by another process (a hub?): a trajectory file has one writer",
                file.string());
      throw Error(fmt::format("cannot lock {}: {}", file.string(), std::strerror(e)));
    }
  }
  WriterLock(WriterLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  WriterLock& operator=(WriterLock&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~WriterLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

inline void quiet_hdf5() {
  static bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become rlx::Error, not stderr noise
    return true;
  }();
  (void)done;
}

// The innermost message of HDF5's error stack (for a failed write, the system's reason:
// "... errno = 28, error message = 'No space left on device' ..."), or "" if none.
inline std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD,
           [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
             auto& r = *static_cast<std::string*>(out);
             if (r.empty() && e->desc && *e->desc) r = e->desc;
             return 0;
           },
           &reason);
  H5Eclear2(H5E_DEFAULT);
  // A system call's failure names the file, the buffer, the time...: keep its reason.
  constexpr std::string_view kSystem = "error message = '";
  if (const auto at = reason.find(kSystem); at != std::string::npos) {
    const auto from = at + kSystem.size();
    reason = reason.substr(from, reason.find('\'', from) - from);
  }
  return reason.empty() ? reason : ": " + reason;
}

// One extendible 1-D column.
struct Column {
  std::string name;
  hid_t file_type;  // H5T_NATIVE_* or the string type
  Handle ds;
  uint64_t extent = 0;  // its length, kept here (asking HDF5 costs a dataspace each time)

  uint64_t size() const {
    Handle space(H5Dget_space(ds.get()), H5Sclose);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    return n;
  }
  void set_size(uint64_t n, const std::string& file) {
    const hsize_t dims = n;
    RLX_CHECK(H5Dset_extent(ds.get(), &dims) >= 0, "{}: cannot resize /{}{}", file, name, hdf5_reason());
    extent = n;
  }
  void append(const void* data, uint64_t n, const std::string& file) {
    if (n == 0) return;
    const hsize_t start = extent, count = n, total = start + n;
    RLX_CHECK(H5Dset_extent(ds.get(), &total) >= 0, "{}: cannot extend /{}{}", file, name, hdf5_reason());
    extent = total;
    Handle fspace(H5Dget_space(ds.get()), H5Sclose);
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr);
    Handle mspace(H5Screate_simple(1, &count, nullptr), H5Sclose);
    RLX_CHECK(H5Dwrite(ds.get(), file_type, mspace.get(), fspace.get(), H5P_DEFAULT, data) >= 0,
              "{}: cannot write /{}{}", file, name, hdf5_reason());
  }
  template <class T>
  std::vector<T> read(uint64_t start, uint64_t count, const std::string& file) const {
    std::vector<T> out(count);
    if (count == 0) return out;
    const hsize_t s = start, c = count;
    Handle fspace(H5Dget_space(ds.get()), H5Sclose);
    RLX_CHECK(start + count <= size(), "{}: /{} has {} entries, {} wanted from {}", file, name, size(), count, start);
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &s, nullptr, &c, nullptr);
    Handle mspace(H5Screate_simple(1, &c, nullptr), H5Sclose);
    RLX_CHECK(H5Dread(ds.get(), file_type, mspace.get(), fspace.get(), H5P_DEFAULT, out.data()) >= 0,
              "{}: cannot read /{}", file, name);
    return out;
  }
};

// A string column: each entry's bytes in /text, from `offset` for `length` bytes.
struct Text {
  Column offset, length;
};

// The file's columns, in a fixed order, and /committed (one uint64, compact: it lives in
// its dataset's header, which SWMR writes in order): the groups the file held at the
// writer's last flush, everything they need on disk. A reader counts no group past it.
struct Columns {
  Handle file, committed;
  std::string path;
  Column tokens, loss_mask, logprobs;
  Column run_version, run_length;
  Column text;
  Column sample_offset, sample_length, first_run, num_runs, prompt_len, reward;
  Text finish, metadata;
  Column lease_id, prompt_index, epoch, first_sample, num_samples, accepted_version;
  Text worker;
  Column routing, routing_offset, routing_layers, routing_top_k;
  bool has_routing = true;  // false: a format 3 file, opened to be upgraded

  std::vector<Column*> all() {
    std::vector<Column*> c{&tokens,         &loss_mask,      &logprobs,        &run_version,      &run_length,      &text,
                           &sample_offset,  &sample_length,  &first_run,       &num_runs,         &prompt_len,      &reward,
                           &finish.offset,  &finish.length,  &metadata.offset, &metadata.length,  &lease_id,        &prompt_index,
                           &epoch,          &first_sample,   &num_samples,     &accepted_version, &worker.offset,   &worker.length};
    if (has_routing) c.insert(c.end(), {&routing, &routing_offset, &routing_layers, &routing_top_k});
    return c;
  }
  // A column has an entry per token, per run of versions, per byte of text, per routing
  // value, per sample or per group.
  struct Counts {
    uint64_t groups = 0, samples = 0, tokens = 0, runs = 0, text = 0, routing = 0;
  };
  uint64_t Counts::*per(const Column* c) const {
    if (c == &tokens || c == &loss_mask || c == &logprobs) return &Counts::tokens;
    if (c == &run_version || c == &run_length) return &Counts::runs;
    if (c == &text) return &Counts::text;
    if (c == &routing) return &Counts::routing;
    if (c == &sample_offset || c == &sample_length || c == &first_run || c == &num_runs || c == &prompt_len ||
        c == &reward || c == &finish.offset || c == &finish.length || c == &metadata.offset || c == &metadata.length ||
        c == &routing_offset || c == &routing_layers || c == &routing_top_k)
      return &Counts::samples;
    return &Counts::groups;
  }
  // The shortest (or longest) column of each kind.
  Counts lengths(bool longest) {
    Counts n;
    if (!longest) n = {~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}};
    if (!has_routing) n.routing = 0;
    for (Column* c : all()) {
      auto& m = n.*per(c);
      m = longest ? std::max(m, c->size()) : std::min(m, c->size());
    }
    return n;
  }
  void set_sizes(const Counts& n) {
    for (Column* c : all()) c->set_size(n.*per(c), path);
  }

  uint64_t committed_groups() const {
    uint64_t n = 0;
    RLX_CHECK(H5Dread(committed.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &n) >= 0, "{}: cannot read /committed{}",
              path, hdf5_reason());
    return n;
  }
  // Records `groups` as committed and flushes: call once they are all in the file.
  void commit(uint64_t groups) {
    RLX_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "{}: flush failed{}", path, hdf5_reason());
    RLX_CHECK(H5Dwrite(committed.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &groups) >= 0,
              "{}: cannot write /committed{}", path, hdf5_reason());
    RLX_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "{}: flush failed{}", path, hdf5_reason());
  }

  // The strings of entries [start, start + count) of `t`.
  std::vector<std::string> read_strings(const Text& t, uint64_t start, uint64_t count) const {
    const auto off = t.offset.read<int64_t>(start, count, path);
    const auto len = t.length.read<uint32_t>(start, count, path);
    std::vector<std::string> out(count);
    if (count == 0) return out;
    const auto from = static_cast<uint64_t>(off.front()), to = static_cast<uint64_t>(off.back()) + len.back();
    RLX_CHECK(off.front() >= 0 && to >= from && to <= text.extent, "{}: /{} entries {}..{} point past /text", path,
              t.offset.name, start, start + count - 1);
    const auto bytes = text.read<char>(from, to - from, path);
    for (uint64_t i = 0; i < count; ++i) {
      const auto at = static_cast<uint64_t>(off[i]) - from;
      RLX_CHECK(off[i] >= off.front() && at + len[i] <= bytes.size(), "{}: /{}[{}] points outside its entries' text", path,
                t.offset.name, start + i);
      out[i].assign(bytes.data() + at, len[i]);
    }
    return out;
  }

  void name_columns() {
    auto set = [](Column& c, const char* n, hid_t t) { c.name = n, c.file_type = t; };
    set(tokens, "tokens", H5T_NATIVE_INT32);
    set(loss_mask, "loss_mask", H5T_NATIVE_UINT8);
    set(logprobs, "logprobs", H5T_NATIVE_FLOAT);
    set(run_version, "run_version", H5T_NATIVE_INT64);
    set(run_length, "run_length", H5T_NATIVE_UINT32);
    set(sample_offset, "sample_offset", H5T_NATIVE_INT64);
    set(sample_length, "sample_length", H5T_NATIVE_INT64);
    set(first_run, "sample_first_run", H5T_NATIVE_INT64);
    set(num_runs, "sample_num_runs", H5T_NATIVE_INT64);
    set(prompt_len, "prompt_len", H5T_NATIVE_INT32);
    set(reward, "reward", H5T_NATIVE_FLOAT);
    set(text, "text", H5T_NATIVE_UINT8);
    set(finish.offset, "finish_offset", H5T_NATIVE_INT64);
    set(finish.length, "finish_length", H5T_NATIVE_UINT32);
    set(metadata.offset, "metadata_offset", H5T_NATIVE_INT64);
    set(metadata.length, "metadata_length", H5T_NATIVE_UINT32);
    set(lease_id, "group_lease_id", H5T_NATIVE_UINT64);
    set(prompt_index, "group_prompt_index", H5T_NATIVE_UINT64);
    set(epoch, "group_epoch", H5T_NATIVE_UINT64);
    set(first_sample, "group_first_sample", H5T_NATIVE_INT64);
    set(num_samples, "group_num_samples", H5T_NATIVE_INT64);
    set(worker.offset, "group_worker_offset", H5T_NATIVE_INT64);
    set(worker.length, "group_worker_length", H5T_NATIVE_UINT32);
    set(accepted_version, "group_accepted_version", H5T_NATIVE_INT64);
    set(routing, "routing", H5T_NATIVE_INT16);
    set(routing_offset, "sample_routing_offset", H5T_NATIVE_INT64);
    set(routing_layers, "sample_routing_layers", H5T_NATIVE_UINT16);
    set(routing_top_k, "sample_routing_top_k", H5T_NATIVE_UINT16);
  }

  // A reader opens the file as a SWMR reader (it may be written meanwhile); the writer
  // creates it in HDF5's latest format, which SWMR needs, and start_swmr() lets readers in.
  // The writer holds the file's WriterLock first: the consistency flags a killed
  // writer left in the file are then known to be stale, and are cleared as h5clear does.
  // `format`: the version expected (kFormatVersion; 3 to read a file being upgraded).
  void open(const std::filesystem::path& p, bool writable, int format = kFormatVersion) {
    RLX_ASSERT(format == kFormatVersion || (!writable && format == 3), "trajectory files are written in format {}",
               kFormatVersion);
    quiet_hdf5();
    path = p.string();
    name_columns();
    has_routing = format >= 4;
    const bool exists = std::filesystem::exists(p);
    RLX_CHECK(exists || writable, "trajectory file {} does not exist", path);
    if (exists) {
      RLX_CHECK(H5Fis_hdf5(path.c_str()) > 0, "{} is not an HDF5 file", path);
      if (writable) {
        open_read_only();  // the format first: a file this build refuses is left as it is
        check_format(format);
        file.reset();
        Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
        H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
        hbool_t clear = 1;  // h5clear's property (HDF5 1.10+): the file's "open for write" flags
        H5Pset(fapl.get(), "clear_status_flags", &clear);
        file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose);
        RLX_CHECK(file, "cannot open {}{}", path, hdf5_reason());
        // A SIGKILLed writer's chunks can lie past the end of allocation its superblock last
        // recorded; writing there fails ("addr overflow"). Allocation then starts at the file's
        // end, as `h5clear --increment` makes it (a cleanly closed file ends at its allocation).
        RLX_CHECK(H5Fincrement_filesize(file.get(), 0) >= 0, "{}: cannot set its end of allocation{}", path,
                  hdf5_reason());
      } else {
        open_read_only();
      }
      check_format(format);
      for (Column* c : all()) {
        c->ds = Handle(H5Dopen2(file.get(), c->name.c_str(), H5P_DEFAULT), H5Dclose);
        RLX_CHECK(c->ds, "{}: dataset /{} is missing", path, c->name);
        c->extent = c->size();
      }
      committed = Handle(H5Dopen2(file.get(), "committed", H5P_DEFAULT), H5Dclose);
      RLX_CHECK(committed, "{}: dataset /committed is missing", path);
      return;
    }
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    file = Handle(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), H5Fclose);
    RLX_CHECK(file, "cannot create {}{}", path, hdf5_reason());
    write_format();
    for (Column* c : all()) {
      const hsize_t zero = 0, unlimited = H5S_UNLIMITED,
                    chunk = per(c) == &Counts::tokens || per(c) == &Counts::routing ? 65536 : 1024;
      Handle space(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
      Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_chunk(plist.get(), 1, &chunk);
      c->ds = Handle(H5Dcreate2(file.get(), c->name.c_str(), c->file_type, space.get(), H5P_DEFAULT, plist.get(),
                                H5P_DEFAULT), H5Dclose);
      RLX_CHECK(c->ds, "{}: cannot create /{}", path, c->name);
    }
    const hsize_t one = 1;
    Handle space(H5Screate_simple(1, &one, nullptr), H5Sclose);
    Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(plist.get(), H5D_COMPACT);
    committed = Handle(H5Dcreate2(file.get(), "committed", H5T_NATIVE_UINT64, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT),
                       H5Dclose);
    RLX_CHECK(committed, "{}: cannot create /committed", path);
    const uint64_t zero = 0;
    RLX_CHECK(H5Dwrite(committed.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &zero) >= 0, "{}: cannot write /committed",
              path);
  }

  // As a SWMR reader (the file may be written meanwhile), or plainly for a file not in
  // HDF5's latest format (none of this build's: check_format then says which it is).
  void open_read_only() {
    // A SWMR reader reads metadata whose checksum fails again, sleeping 1, 2, 4, ... ns
    // between reads (a writer may be midway through it); HDF5's 100 reads would sleep for
    // ages on metadata a killed writer left torn. 32 reads sleep about 4 s in all, then fail.
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_metadata_read_attempts(fapl.get(), 32);
    file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get()), H5Fclose);
    if (!file) {
      H5Eclear2(H5E_DEFAULT);
      file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    }
    RLX_CHECK(file, "cannot open {}{}", path, hdf5_reason());
  }

  // From here on, readers may open the file while this writer appends (no new datasets or
  // attributes can be made in SWMR mode: open() made them all).
  void start_swmr() {
    RLX_CHECK(H5Fstart_swmr_write(file.get()) >= 0, "{}: cannot start SWMR writing{}", path, hdf5_reason());
  }

  // The end of sample `s`'s text (its metadata's end; 0 before the first sample).
  int64_t text_end(uint64_t s) const {
    if (s == 0) return 0;
    return metadata.offset.read<int64_t>(s - 1, 1, path)[0] + metadata.length.read<uint32_t>(s - 1, 1, path)[0];
  }

  // What every column holds: after an unclean stop (SIGKILL, power loss) each column is as
  // long as HDF5 had written it, and past the last flush the lengths differ. The groups
  // counted are at most /committed, and those whose samples, tokens, runs and text all the
  // columns hold, each chained to the one before (a chunk HDF5 never wrote reads as zeros,
  // which do not chain). A group's text is its worker's name, then each sample's finish
  // reason and metadata.
  Counts whole() {
    const auto [g_longest, s_have, t_have, r_have, x_have, e_have] = lengths(/*longest=*/false);
    const uint64_t g_have = std::min(g_longest, committed_groups());
    const auto first = first_sample.read<int64_t>(0, g_have, path), count = num_samples.read<int64_t>(0, g_have, path);
    for (uint64_t g = g_have; g > 0; --g) {
      const uint64_t k = g - 1;
      const int64_t chained = k == 0 ? 0 : first[k - 1] + count[k - 1];
      if (count[k] < 1 || first[k] != chained || static_cast<uint64_t>(first[k] + count[k]) > s_have) continue;
      const auto s = static_cast<uint64_t>(first[k] + count[k]);
      const uint64_t from = s >= 2 ? s - 2 : 0;
      const auto off = sample_offset.read<int64_t>(from, s - from, path), len = sample_length.read<int64_t>(from, s - from, path);
      const int64_t t_chained = s >= 2 ? off[0] + len[0] : 0;
      if (off.back() != t_chained || len.back() < 0 || static_cast<uint64_t>(off.back() + len.back()) > t_have) continue;
      const auto r0 = first_run.read<int64_t>(from, s - from, path), rn = num_runs.read<int64_t>(from, s - from, path);
      const int64_t r_chained = s >= 2 ? r0[0] + rn[0] : 0;
      if (r0.back() != r_chained || rn.back() < 0 || static_cast<uint64_t>(r0.back() + rn.back()) > r_have) continue;
      const auto text_to = text_chain(k, static_cast<uint64_t>(first[k]), static_cast<uint64_t>(count[k]));
      if (!text_to || *text_to > x_have) continue;
      uint64_t routing_to = 0;
      if (has_routing) {
        const auto e0 = routing_offset.read<int64_t>(from, s - from, path);
        const auto el = routing_layers.read<uint16_t>(from, s - from, path);
        const auto ek = routing_top_k.read<uint16_t>(from, s - from, path);
        const auto values = [&](size_t j) { return e0[j] + len[j] * static_cast<int64_t>(el[j]) * ek[j]; };
        const int64_t e_chained = s >= 2 ? values(0) : 0;
        if (e0.back() != e_chained || static_cast<uint64_t>(values(e0.size() - 1)) > e_have) continue;
        routing_to = static_cast<uint64_t>(values(e0.size() - 1));
      }
      return {g, s, static_cast<uint64_t>(off.back() + len.back()), static_cast<uint64_t>(r0.back() + rn.back()), *text_to,
              routing_to};
    }
    return {};
  }
  // Where group g's text ends, if its strings follow one another from where the samples
  // before it ended; nothing if they do not.
  std::optional<uint64_t> text_chain(uint64_t g, uint64_t s0, uint64_t n) const {
    int64_t at = text_end(s0);
    if (worker.offset.read<int64_t>(g, 1, path)[0] != at) return std::nullopt;
    at += worker.length.read<uint32_t>(g, 1, path)[0];
    const auto fo = finish.offset.read<int64_t>(s0, n, path), mo = metadata.offset.read<int64_t>(s0, n, path);
    const auto fl = finish.length.read<uint32_t>(s0, n, path), ml = metadata.length.read<uint32_t>(s0, n, path);
    for (uint64_t j = 0; j < n; ++j) {
      if (fo[j] != at) return std::nullopt;
      at += fl[j];
      if (mo[j] != at) return std::nullopt;
      at += ml[j];
    }
    return static_cast<uint64_t>(at);
  }

  void write_format() {
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle fmt_type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(fmt_type.get(), std::char_traits<char>::length(kFormat));
    Handle a(H5Acreate2(file.get(), "format", fmt_type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    H5Awrite(a.get(), fmt_type.get(), kFormat);
    Handle v(H5Acreate2(file.get(), "format_version", H5T_NATIVE_INT, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    H5Awrite(v.get(), H5T_NATIVE_INT, &kFormatVersion);
  }

  void check_format(int format) {
    const int version = format_version(file, path);
    RLX_CHECK(version == format, "{}: trajectory format version {} (this build reads {}{})", path, version, format,
              version < format ? "; `rlx inspect trajectories FILE --upgrade-to NEW.h5` converts it" : "");
  }
  static int format_version(const Handle& file, const std::string& path) {
    RLX_CHECK(H5Aexists(file.get(), "format") > 0 && H5Aexists(file.get(), "format_version") > 0,
              "{} is not an rlx trajectory file (no format attribute)", path);
    Handle a(H5Aopen(file.get(), "format", H5P_DEFAULT), H5Aclose);
    Handle t(H5Aget_type(a.get()), H5Tclose);
    std::string value(H5Tget_size(t.get()), '\0');
    RLX_CHECK(H5Tget_class(t.get()) == H5T_STRING && H5Aread(a.get(), t.get(), value.data()) >= 0 &&
                  value.c_str() == std::string(kFormat),
              "{} is not an rlx trajectory file (format attribute)", path);
    Handle v(H5Aopen(file.get(), "format_version", H5P_DEFAULT), H5Aclose);
    int version = 0;
    H5Aread(v.get(), H5T_NATIVE_INT, &version);
    return version;
  }
};

}  // namespace rlx::bus::h5
