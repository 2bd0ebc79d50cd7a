#include "rlx/dist/weight_sync.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rlx/core/hash.hpp"

#include <atomic>
#include <cstring>
#include <optional>
#include <thread>

#include "cuda_ipc.hpp"
#include "ipc_importers.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx::dist {

namespace {

constexpr char kMagic[8] = {'R', 'L', 'X', 'W', 'S', 'Y', 'N', '1'};
constexpr uint32_t kFormat = 3;  // 2: the slots may be CUDA device buffers; 3: the importer table
constexpr int kMaxDims = 8;
constexpr size_t kNameBytes = 192;

struct alignas(64) SlotHeader {
  std::atomic<uint64_t> seq;      // odd while the slot is being written
  std::atomic<int64_t> version;   // the version the slot holds once seq is even
};

struct alignas(64) SegmentHeader {
  std::atomic<uint64_t> magic;    // written last by the creator
  uint32_t format;
  int32_t dtype;                  // c10::ScalarType
  int64_t n_tensors;
  int64_t slot_bytes;             // one version's bytes, each tensor 64-byte aligned
  int64_t table_offset, data_offset, total_bytes;
  std::atomic<int64_t> published; // newest complete version (0: none yet)
  std::atomic<int32_t> active;    // the slot holding it
  std::atomic<int32_t> closed;    // the publisher shut down
  int32_t device;                 // -1: the slots follow the table; >= 0: buffers on this CUDA device
  detail::IpcHandles ipc_handles;  // device >= 0: each slot's cudaIpcMemHandle_t
  std::atomic<int32_t> publisher_pid;
  detail::ImporterTable importers;  // device >= 0: the processes mapping the slots now (ipc_importers.hpp)
  SlotHeader slots[2];
};

struct TableEntry {
  char name[kNameBytes];
  int64_t offset;  // within a slot
  int64_t bytes;
  int32_t ndim;
  int64_t shape[kMaxDims];
  std::atomic<int64_t> last_changed;  // the newest version whose bytes differ from the one before
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

uint64_t magic_word() {
  uint64_t m = 0;
  std::memcpy(&m, kMagic, sizeof m);
  return m;
}

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

std::string shm_path(const std::string& name) { return "/" + name; }

void check_name(const std::string& name) {
  RLX_CHECK(!name.empty() && name.size() < 200 && name.find('/') == std::string::npos,
            "weight sync: segment name {:?} must be 1-199 characters without '/'", name);
}

}  // namespace

// Outside the anonymous namespace because the Impls hold it (GCC's -Wsubobject-linkage, as
// unity builds include this file).
namespace detail {
struct Mapping {
  int fd = -1;
  void* base = MAP_FAILED;
  size_t size = 0;
  ino_t inode = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, size);
    if (fd >= 0) ::close(fd);
  }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base); }
  TableEntry* table() const {
    return reinterpret_cast<TableEntry*>(static_cast<char*>(base) + header()->table_offset);
  }
  char* slot(int s) const { return static_cast<char*>(base) + header()->data_offset + s * header()->slot_bytes; }
};
}  // namespace detail
using detail::Mapping;

WeightLayout WeightLayout::of(const std::vector<std::pair<std::string, at::Tensor>>& tensors, at::ScalarType dtype) {
  WeightLayout l;
  l.dtype = dtype;
  for (const auto& [name, t] : tensors) l.tensors.emplace_back(name, t.sizes().vec());
  return l;
}

int64_t WeightLayout::bytes() const {
  int64_t total = 0;
  for (const auto& [offset, bytes] : spans()) total = offset + align64(bytes);
  return total;
}

std::vector<std::pair<int64_t, int64_t>> WeightLayout::spans() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    const int64_t bytes = n * static_cast<int64_t>(c10::elementSize(dtype));
    out.emplace_back(offset, bytes);
    offset += align64(bytes);
  }
  return out;
}

void WeightLayout::check(const std::vector<std::pair<std::string, at::Tensor>>& given) const {
  RLX_CHECK(given.size() == tensors.size(), "weight sync: {} tensors given, the layout has {}", given.size(),
            tensors.size());
  for (size_t i = 0; i < given.size(); ++i) {
    const auto& [name, shape] = tensors[i];
    RLX_CHECK(given[i].first == name && given[i].second.sizes().vec() == shape,
              "weight sync: tensor {} is {:?} {}, the layout says {:?} {}", i, given[i].first, given[i].second.sizes(),
              name, c10::IntArrayRef(shape));
  }
}

// --- publisher ---------------------------------------------------------------------

struct ShmWeightPublisher::Impl {
  Mapping map;
  int64_t last_full = 0;
  at::Device device = at::kCPU;
  detail::CudaIpcSlots cuda;  // device.is_cuda(): the slots
  char* slot(int s) const { return device.is_cuda() ? cuda.slot(s) : map.slot(s); }
};

ShmWeightPublisher::ShmWeightPublisher(ShmSyncOptions options, WeightLayout layout)
    : impl_(std::make_unique<Impl>()), opt_(std::move(options)), layout_(std::move(layout)) {
  check_name(opt_.name);
  const auto n = static_cast<int64_t>(layout_.tensors.size());
  RLX_CHECK(n > 0 && n <= kMaxSyncTensors, "weight sync: {} tensors (1 to {})", n, kMaxSyncTensors);
  RLX_CHECK(at::isFloatingType(layout_.dtype), "weight sync: dtype {} is not floating-point",
            c10::toString(layout_.dtype));
  RLX_CHECK(opt_.full_every >= 1, "weight sync: full_every must be >= 1, got {}", opt_.full_every);
  const int64_t slot_bytes = layout_.bytes();
  RLX_CHECK(slot_bytes <= kMaxSyncBytes, "weight sync: {} bytes per version exceeds {}", slot_bytes, kMaxSyncBytes);
  const int64_t table_offset = align64(sizeof(SegmentHeader));
  const int64_t data_offset = align64(table_offset + n * static_cast<int64_t>(sizeof(TableEntry)));
  try {
    impl_->device = at::Device(opt_.device);
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("weight sync: device {:?} is not cpu or cuda:N", opt_.device));
  }
  RLX_CHECK(impl_->device.is_cpu() || impl_->device.is_cuda(), "weight sync: device {:?} is not cpu or cuda:N", opt_.device);
  const bool on_device = impl_->device.is_cuda();
  RLX_CHECK(!on_device || detail::CudaIpcSlots::available(),
            "weight sync: device {} (CUDA IPC) needs a build of rlx with CUDA (RLX_CUDA)", opt_.device);
  const int64_t total = data_offset + (on_device ? 0 : 2 * slot_bytes);

  auto& m = impl_->map;
  ::shm_unlink(shm_path(opt_.name).c_str());  // a segment left by a publisher that died
  m.fd = ::shm_open(shm_path(opt_.name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  RLX_CHECK(m.fd >= 0, "weight sync: cannot create /dev/shm/{}: {}", opt_.name, std::strerror(errno));
  if (::ftruncate(m.fd, total) != 0) {
    const int e = errno;
    ::shm_unlink(shm_path(opt_.name).c_str());
    throw Error(fmt::format("weight sync: cannot size /dev/shm/{} to {} bytes: {}", opt_.name, total, std::strerror(e)));
  }
  m.size = static_cast<size_t>(total);
  m.base = ::mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
  RLX_CHECK(m.base != MAP_FAILED, "weight sync: cannot map /dev/shm/{}: {}", opt_.name, std::strerror(errno));

  auto* h = new (m.base) SegmentHeader{};
  h->format = kFormat;
  h->dtype = static_cast<int32_t>(layout_.dtype);
  h->n_tensors = n;
  h->slot_bytes = slot_bytes;
  h->table_offset = table_offset;
  h->data_offset = data_offset;
  h->total_bytes = total;
  h->device = on_device ? (impl_->device.has_index() ? impl_->device.index() : 0) : -1;
  h->publisher_pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  if (on_device) {
    try {
      impl_->cuda.allocate(h->device, slot_bytes, h->ipc_handles);
    } catch (...) {
      ::shm_unlink(shm_path(opt_.name).c_str());
      throw;
    }
  }
  auto* table = m.table();
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& [name, shape] = layout_.tensors[static_cast<size_t>(i)];
    RLX_CHECK(name.size() < kNameBytes, "weight sync: tensor name {:?} is longer than {} bytes", name, kNameBytes - 1);
    RLX_CHECK(shape.size() <= kMaxDims, "weight sync: tensor {:?} has {} dimensions (at most {})", name, shape.size(),
              kMaxDims);
    auto* e = new (&table[i]) TableEntry{};
    std::memcpy(e->name, name.data(), name.size());
    int64_t numel = 1;
    for (size_t d = 0; d < shape.size(); ++d) e->shape[d] = shape[d], numel *= shape[d];
    e->ndim = static_cast<int32_t>(shape.size());
    e->offset = offset;
    e->bytes = numel * static_cast<int64_t>(c10::elementSize(layout_.dtype));
    offset += align64(e->bytes);
  }
  hashes_.assign(static_cast<size_t>(n), 0);
  h->magic.store(magic_word(), std::memory_order_release);
}

ShmWeightPublisher::~ShmWeightPublisher() {
  if (impl_ && impl_->map.base != MAP_FAILED) {
    auto* h = impl_->map.header();
    h->closed.store(1, std::memory_order_release);
    ::shm_unlink(shm_path(opt_.name).c_str());
    if (impl_->device.is_cuda()) {
      // A subscriber maps the device slots only while it copies a version, and no new copy
      // starts once `closed` is set: wait for the ones under way before freeing the buffers
      // (freeing memory another process has open is undefined in CUDA).
      const auto left = detail::wait_importers_released(h->importers, opt_.close_wait_s);
      if (!left.empty()) {
        log::warn("weight sync: /dev/shm/{}: {} process(es) (pid {}) still map the device slots after {} s; they are "
                  "left to the driver at exit instead of freed",
                  opt_.name, left.size(), left.front(), opt_.close_wait_s);
        impl_->cuda.abandon();
      }
    }
  }
}

int64_t ShmWeightPublisher::publish(int64_t version, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  RLX_CHECK(version > version_, "weight sync: version {} after {}: versions must increase", version, version_);
  layout_.check(tensors);
  auto& m = impl_->map;
  auto* h = m.header();
  auto* table = m.table();
  const int64_t published = h->published.load(std::memory_order_relaxed);
  const int slot = published == 0 ? 0 : 1 - h->active.load(std::memory_order_relaxed);
  auto& sh = h->slots[slot];
  const int64_t slot_version = sh.version.load(std::memory_order_relaxed);
  const bool full = !opt_.delta || published == 0 || version - impl_->last_full >= opt_.full_every;
  if (full) impl_->last_full = version;

  // Which tensors changed in this version (delta mode hashes their bytes in the sync dtype).
  std::vector<at::Tensor> converted(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!opt_.delta) {
      table[i].last_changed.store(version, std::memory_order_relaxed);
      continue;
    }
    converted[i] = tensors[i].second.detach().to(at::kCPU, layout_.dtype).contiguous();
    const uint64_t hash = hash64(converted[i].data_ptr(), static_cast<size_t>(table[i].bytes));
    if (full || hash != hashes_[i]) table[i].last_changed.store(version, std::memory_order_relaxed);
    hashes_[i] = hash;
  }

  // Seqlock write: odd while the slot changes.
  sh.seq.fetch_add(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  int64_t written = 0;
  char* base = impl_->slot(slot);
  const auto options = at::TensorOptions().dtype(layout_.dtype).device(impl_->device);
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& e = table[i];
    if (e.last_changed.load(std::memory_order_relaxed) <= slot_version) continue;  // the slot already has these bytes
    auto dst = at::from_blob(base + e.offset, tensors[i].second.sizes(), options);
    dst.copy_(converted[i].defined() ? converted[i] : tensors[i].second.detach());
    written += e.bytes;
  }
  if (impl_->device.is_cuda()) detail::CudaIpcSlots::finish();  // every byte is there before the slot is published
  sh.version.store(version, std::memory_order_relaxed);
  sh.seq.fetch_add(1, std::memory_order_release);
  h->active.store(slot, std::memory_order_release);
  h->published.store(version, std::memory_order_release);
  version_ = version;
  return written;
}

// --- subscriber ----------------------------------------------------------------------

struct ShmWeightSubscriber::Impl {
  std::unique_ptr<Mapping> map;
  int device = -1;  // >= 0: the slots are CUDA device buffers, mapped only while a version is copied
};

ShmWeightSubscriber::ShmWeightSubscriber(ShmSyncOptions options)
    : impl_(std::make_unique<Impl>()), opt_(std::move(options)) {
  check_name(opt_.name);
  RLX_CHECK(opt_.max_retries >= 1, "weight sync: max_retries must be >= 1");
  attach(opt_.attach_timeout_s);
}

ShmWeightSubscriber::~ShmWeightSubscriber() = default;

void ShmWeightSubscriber::attach(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  const std::string where = "/dev/shm/" + opt_.name;
  for (;;) {
    auto m = std::make_unique<Mapping>();
    m->fd = ::shm_open(shm_path(opt_.name).c_str(), O_RDWR, 0);  // read-write: the importer table
    struct stat st {};
    if (m->fd >= 0 && ::fstat(m->fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(SegmentHeader))) {
      m->size = static_cast<size_t>(st.st_size);
      m->inode = st.st_ino;
      m->base = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
      RLX_CHECK(m->base != MAP_FAILED, "weight sync: cannot map {}: {}", where, std::strerror(errno));
      auto* h = m->header();
      if (h->magic.load(std::memory_order_acquire) == magic_word()) {
        // Validate everything the segment claims before using any of it.
        RLX_CHECK(h->format == kFormat, "weight sync: {} has format {}, this build reads {}", where, h->format, kFormat);
        RLX_CHECK(h->n_tensors > 0 && h->n_tensors <= kMaxSyncTensors && h->slot_bytes >= 0 &&
                      h->slot_bytes <= kMaxSyncBytes && h->table_offset >= static_cast<int64_t>(sizeof(SegmentHeader)) &&
                      h->data_offset >= h->table_offset + h->n_tensors * static_cast<int64_t>(sizeof(TableEntry)) &&
                      h->device >= -1 && h->device < 4096 &&
                      h->total_bytes == h->data_offset + (h->device < 0 ? 2 * h->slot_bytes : 0) &&
                      h->total_bytes <= static_cast<int64_t>(m->size),
                  "weight sync: {} has an inconsistent header ({} tensors, {} bytes per slot, {} bytes mapped)", where,
                  h->n_tensors, h->slot_bytes, m->size);
        const auto dtype = static_cast<at::ScalarType>(h->dtype);
        RLX_CHECK(h->dtype >= 0 && h->dtype < static_cast<int32_t>(at::ScalarType::NumOptions) && at::isFloatingType(dtype),
                  "weight sync: {} has dtype code {}, not a floating-point type", where, h->dtype);
        WeightLayout layout;
        layout.dtype = dtype;
        for (int64_t i = 0; i < h->n_tensors; ++i) {
          const auto& e = m->table()[i];
          const auto len = ::strnlen(e.name, kNameBytes);
          RLX_CHECK(len < kNameBytes && e.ndim >= 0 && e.ndim <= kMaxDims, "weight sync: {}: table entry {} is malformed",
                    where, i);
          int64_t numel = 1;
          std::vector<int64_t> shape(e.shape, e.shape + e.ndim);
          for (auto d : shape) {
            RLX_CHECK(d >= 0 && d <= kMaxSyncBytes, "weight sync: {}: tensor {} has dimension {}", where, i, d);
            numel *= d;
          }
          RLX_CHECK(e.bytes == numel * static_cast<int64_t>(c10::elementSize(dtype)) && e.offset >= 0 &&
                        e.offset + e.bytes <= h->slot_bytes,
                    "weight sync: {}: tensor {} ({:?}) lies outside its slot", where, i, std::string(e.name, len));
          layout.tensors.emplace_back(std::string(e.name, len), std::move(shape));
        }
        auto buffer_options = at::TensorOptions().dtype(at::kByte);
        if (h->device >= 0) {
          RLX_CHECK(detail::CudaIpcSlots::available(),
                    "weight sync: {}'s slots are on CUDA device {} (CUDA IPC), and this build of rlx has no CUDA (RLX_CUDA)",
                    where, h->device);
          buffer_options = buffer_options.device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(h->device)));
        }
        layout_ = std::move(layout);
        impl_->device = h->device;
        impl_->map = std::move(m);
        for (auto& b : buffers_) b = at::empty({h->slot_bytes}, buffer_options);
        buffer_version_[0] = buffer_version_[1] = 0;
        version_ = 0;
        return;
      }
    }
    RLX_CHECK(now_s() < deadline, "weight sync: no publisher created {} within {} s", where, timeout_s);
    RLX_CHECK(!opt_.give_up || !opt_.give_up(), "weight sync: gave up waiting for a publisher to create {}", where);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<WeightUpdate> ShmWeightSubscriber::poll() {
  auto* m = impl_->map.get();
  auto* h = m->header();
  int64_t v = h->published.load(std::memory_order_acquire);
  if (v <= version_) {
    // Nothing new here: has a new publisher replaced the segment (this one closed or unlinked)?
    struct stat st {};
    const bool replaced = ::stat(("/dev/shm/" + opt_.name).c_str(), &st) == 0 && st.st_ino != m->inode;
    if (h->closed.load(std::memory_order_acquire) || replaced) {
      const int64_t delivered = version_;
      try {
        attach(0);
      } catch (const Error&) {
        return std::nullopt;  // no new publisher yet
      }
      // A version is one learner step's weights: the new publisher's (a learner restarted from
      // that step's checkpoint, or the closing one's segment seen again) is not handed out twice.
      if (impl_->map->header()->published.load(std::memory_order_acquire) == delivered) {
        version_ = delivered;
        return std::nullopt;
      }
      return poll();
    }
    return std::nullopt;
  }
  // CUDA IPC: the publisher's device slots are mapped for this copy only, with this process
  // in the segment's importer table meanwhile (a closing publisher waits for it).
  struct DeviceSlots {
    detail::ImporterTable* table = nullptr;
    int entry = -1;
    int32_t pid = 0;
    std::optional<detail::CudaIpcSlots> slots;
    ~DeviceSlots() {
      slots.reset();  // closed before the entry goes
      if (table) detail::release_importer(*table, entry, pid);
    }
  } device;
  const auto publisher_gone = [&] {
    return h->closed.load(std::memory_order_acquire) || !detail::process_alive(h->publisher_pid.load(std::memory_order_acquire));
  };
  if (impl_->device >= 0) {
    device.pid = static_cast<int32_t>(::getpid());
    device.entry = detail::claim_importer(h->importers, device.pid);
    RLX_CHECK(device.entry >= 0, "weight sync: /dev/shm/{}: {} processes already map its device slots", opt_.name,
              detail::kMaxImporters);
    device.table = &h->importers;
    if (publisher_gone()) return std::nullopt;  // closing or dead: its buffers are not ours to read; re-attach later
    device.slots.emplace();
    device.slots->open(impl_->device, h->ipc_handles);
  }
  const auto slot = [&](int s) -> const char* { return device.slots ? device.slots->slot(s) : impl_->map->slot(s); };
  WeightUpdate u;
  const int target = 1 - current_;
  for (int attempt = 0; attempt < opt_.max_retries; ++attempt, ++u.retries) {
    const int s = h->active.load(std::memory_order_acquire);
    const uint64_t seq1 = h->slots[s].seq.load(std::memory_order_acquire);
    v = h->published.load(std::memory_order_acquire);
    if ((seq1 & 1) != 0 || h->slots[s].version.load(std::memory_order_relaxed) != v) {
      std::this_thread::yield();  // caught between a write and its publication
      continue;
    }
    const int64_t have = buffer_version_[target];
    char* dst = static_cast<char*>(buffers_[target].data_ptr());
    const char* src = slot(s);
    int64_t copied = 0;
    for (int64_t i = 0; i < h->n_tensors; ++i) {
      const auto& e = m->table()[i];
      if (have > 0 && e.last_changed.load(std::memory_order_relaxed) <= have) continue;  // unchanged since `have`
      if (device.slots) detail::CudaIpcSlots::copy(dst + e.offset, src + e.offset, e.bytes);
      else std::memcpy(dst + e.offset, src + e.offset, static_cast<size_t>(e.bytes));
      copied += e.bytes;
    }
    if (device.slots) detail::CudaIpcSlots::finish();  // the copy is complete before the seqlock is re-checked
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->slots[s].seq.load(std::memory_order_relaxed) != seq1) {
      buffer_version_[target] = 0;  // partly overwritten: the next attempt copies everything
      continue;
    }
    if (device.slots && !detail::process_alive(h->publisher_pid.load(std::memory_order_acquire))) {
      buffer_version_[target] = 0;  // the publisher died during the copy: its buffers may be gone; not handed out
      return std::nullopt;
    }
    buffer_version_[target] = v;
    current_ = target;
    version_ = v;
    u.version = v;
    u.bytes_copied += copied;
    for (int64_t i = 0; i < h->n_tensors; ++i) {
      const auto& e = m->table()[i];
      const auto& [name, shape] = layout_.tensors[static_cast<size_t>(i)];
      u.tensors.emplace_back(name, at::from_blob(dst + e.offset, shape, buffers_[target].options().dtype(layout_.dtype)));
    }
    return u;
  }
  throw Error(fmt::format("weight sync: /dev/shm/{}: {} copies of version {} raced the publisher's writes",
                          opt_.name, opt_.max_retries, v));
}

}  // namespace rlx::dist
