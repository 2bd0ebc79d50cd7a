// The rendezvous store: the environment a launcher passes its ranks, the TCPStore server a
// launcher hosts, and what a launcher records in it (see rlx/dist/rendezvous.hpp).
#include "rlx/dist/rendezvous.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "dist/errors.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "rlx/dist/comm.hpp"

namespace rlx::dist {

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  int out = 0;
  auto [end, ec] = std::from_chars(v, v + std::strlen(v), out);
  RLX_CHECK(ec == std::errc() && *end == '\0' && out >= lo && out <= hi,
            "environment variable {}={:?} must be an integer in [{}, {}]", name, v, lo, hi);
  return out;
}

}  // namespace

RendezvousOptions rendezvous_from_env() {
  RendezvousOptions o;
  o.world_size = env_int("RLX_WORLD_SIZE", 1, 1, 1 << 16);
  o.rank = env_int("RLX_RANK", 0, 0, o.world_size - 1);
  const std::string store = env_or("RLX_STORE", "");
  if (!store.empty()) std::tie(o.store_host, o.store_port) = store_address(store, "environment variable RLX_STORE");
  o.host_store = env_int("RLX_STORE_HOST_SELF", 0, 0, 1) == 1;
  o.timeout_s = env_int("RLX_COMM_TIMEOUT_S", 300, 1, 24 * 3600);
  o.interface_host = env_or("RLX_COMM_INTERFACE", o.store_host.c_str());
  const std::string backend = env_or("RLX_COMM_BACKEND", "");
  RLX_CHECK(backend.empty() || backend == "gloo" || backend == "nccl",
            "environment variable RLX_COMM_BACKEND={:?} must be gloo or nccl", backend);
  o.nccl = backend == "nccl";
  RLX_CHECK(o.world_size == 1 || o.store_port > 0 || o.host_store,
            "RLX_WORLD_SIZE={} needs RLX_STORE=host:port (the rendezvous store)", o.world_size);
  return o;
}

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(const std::string& host, int port) : host_(host), impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(30);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rendezvous store: cannot listen on {}:{}: {}", host, port, error_text(e)));
  }
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const { return impl_->store->getPort(); }

void StoreServer::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string exit_key(int rank) { return fmt::format("rlx/exit/{}", rank); }

std::pair<std::string, int> store_address(const std::string& address, std::string_view what) {
  const auto colon = address.rfind(':');
  RLX_CHECK(colon != std::string::npos && colon > 0, "{}={:?} must be host:port", what, address);
  const std::string port = address.substr(colon + 1);
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  RLX_CHECK(ec == std::errc() && end == port.data() + port.size() && p > 0 && p < 65536, "{}={:?}: {:?} is not a port",
            what, address, port);
  return {address.substr(0, colon), p};
}

void record_exit(const std::string& store, int rank, const std::string& how) {
  try {
    const auto [host, port] = store_address(store, "the rendezvous store");
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = std::chrono::seconds(3);
    c10d::TCPStore(host, o).set(exit_key(rank), std::vector<uint8_t>(how.begin(), how.end()));
  } catch (const std::exception& e) {  // the peers' diagnosis falls back to their heartbeats
    log::warn("cannot record in the rendezvous store {} that rank {} ended: {}", store, rank, error_text(e));
  }
}

}  // namespace rlx::dist
