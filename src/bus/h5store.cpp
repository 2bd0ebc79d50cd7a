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

namespace rlx::bus {

namespace {

constexpr const char* kFormat = "rlx-trajectories";
// 3: strings as bytes in /text, written for SWMR readers; 2: versions as runs (1: /versions
// int64 per token).
constexpr int kFormatVersion = 3;

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

void quiet_hdf5() {
  static bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become rlx::Error, not stderr noise
    return true;
  }();
  (void)done;
}

// The innermost message of HDF5's error stack (for a failed write, the system's reason:
// "... errno = 28, error message = 'No space left on device' ..."), or "" if none.
std::string hdf5_reason() {
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

  std::vector<Column*> all() {
    return {&tokens,         &loss_mask,      &logprobs,        &run_version,      &run_length,      &text,
            &sample_offset,  &sample_length,  &first_run,       &num_runs,         &prompt_len,      &reward,
            &finish.offset,  &finish.length,  &metadata.offset, &metadata.length,  &lease_id,        &prompt_index,
            &epoch,          &first_sample,   &num_samples,     &accepted_version, &worker.offset,   &worker.length};
  }
  // A column has an entry per token, per run of versions, per byte of text, per sample or
  // per group.
  struct Counts {
    uint64_t groups = 0, samples = 0, tokens = 0, runs = 0, text = 0;
  };
  uint64_t Counts::*per(const Column* c) const {
    if (c == &tokens || c == &loss_mask || c == &logprobs) return &Counts::tokens;
    if (c == &run_version || c == &run_length) return &Counts::runs;
    if (c == &text) return &Counts::text;
    if (c == &sample_offset || c == &sample_length || c == &first_run || c == &num_runs || c == &prompt_len ||
        c == &reward || c == &finish.offset || c == &finish.length || c == &metadata.offset || c == &metadata.length)
      return &Counts::samples;
    return &Counts::groups;
  }
  // The shortest (or longest) column of each kind.
  Counts lengths(bool longest) {
    Counts n;
    if (!longest) n = {~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}};
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
  }

  // A reader opens the file as a SWMR reader (it may be written meanwhile); the writer
  // creates it in HDF5's latest format, which SWMR needs, and start_swmr() lets readers in.
  // The writer holds the file's WriterLock first: the consistency flags a killed
  // writer left in the file are then known to be stale, and are cleared as h5clear does.
  void open(const std::filesystem::path& p, bool writable) {
    quiet_hdf5();
    path = p.string();
    name_columns();
    const bool exists = std::filesystem::exists(p);
    RLX_CHECK(exists || writable, "trajectory file {} does not exist", path);
    if (exists) {
      RLX_CHECK(H5Fis_hdf5(path.c_str()) > 0, "{} is not an HDF5 file", path);
      if (writable) {
        open_read_only();  // the format first: a file this build refuses is left as it is
        check_format();
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
      check_format();
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
      const hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = per(c) == &Counts::tokens ? 65536 : 1024;
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
    file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT), H5Fclose);
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
    const auto [g_longest, s_have, t_have, r_have, x_have] = lengths(/*longest=*/false);
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
      return {g, s, static_cast<uint64_t>(off.back() + len.back()), static_cast<uint64_t>(r0.back() + rn.back()), *text_to};
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

  void check_format() {
    const int version = format_version(file, path);
    RLX_CHECK(version == kFormatVersion, "{}: trajectory format version {} (this build reads {}{})", path, version,
              kFormatVersion, version < kFormatVersion ? "; `rlx inspect trajectories FILE --upgrade-to NEW.h5` converts it" : "");
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

}  // namespace

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
  }
};

struct TrajectoryStore::Impl {
  WriterLock lock;
  std::filesystem::path path;
  StoreOptions options;
  Columns cols;
  Stage stage;
  uint64_t groups = 0, samples = 0, tokens = 0, runs = 0, text = 0;  // in the file and staged
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
  const auto had = c.lengths(/*longest=*/true);
  if (had.groups != n.groups || had.samples != n.samples || had.tokens != n.tokens || had.runs != n.runs || had.text != n.text) {
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
    st.bytes += n * (sizeof(int32_t) + sizeof(uint8_t) + sizeof(float)) + (st.run_version.size() - r) * 12 + 64;
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
  uint64_t samples = 0, tokens = 0, runs = 0, text = 0;
  if (groups > 0) {
    const auto first = c.first_sample.read<int64_t>(groups, 1, c.path)[0];
    samples = static_cast<uint64_t>(first);
    tokens = static_cast<uint64_t>(c.sample_offset.read<int64_t>(samples, 1, c.path)[0]);
    runs = static_cast<uint64_t>(c.first_run.read<int64_t>(samples, 1, c.path)[0]);
    text = static_cast<uint64_t>(c.worker.offset.read<int64_t>(groups, 1, c.path)[0]);
  }
  c.set_sizes({groups, samples, tokens, runs, text});
  impl_->groups = groups, impl_->samples = samples, impl_->tokens = tokens, impl_->runs = runs, impl_->text = text;
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
}  // namespace

std::vector<TrajectoryGroup> read_trajectory_groups(const std::filesystem::path& file, uint64_t first, uint64_t count) {
  Columns c;
  c.open(file, /*writable=*/false);
  const uint64_t total = c.whole().groups;
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
    for (uint64_t j = 0; j < sn; ++j) {
      Trajectory t;
      const auto o = static_cast<uint64_t>(off[j]), n = static_cast<uint64_t>(len[j]);
      t.tokens = c.tokens.read<int32_t>(o, n, c.path);
      t.loss_mask = c.loss_mask.read<uint8_t>(o, n, c.path);
      t.logprobs = c.logprobs.read<float>(o, n, c.path);
      t.versions = read_versions(c.run_version, c.run_length, c.path, r0[j], rn[j], n, s0 + j);
      t.prompt_len = plen[j], t.reward = rew[j], t.finish = fin[j], t.metadata = meta[j];
      g.samples.push_back(std::move(t));
    }
  }
  return out;
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
  RLX_CHECK(version == 1 || version == 2, "{}: trajectory format version {}, {}", path, version,
            version == kFormatVersion ? "this build's already" : "which this build cannot upgrade (it upgrades 1 and 2)");
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
