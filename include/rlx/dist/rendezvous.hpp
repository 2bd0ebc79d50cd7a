// How the ranks of a group find each other: a c10d TCPStore that one process
// hosts (the launcher, or rank 0) and every rank connects to.
//
// A launcher hosts the store and passes its address to the ranks it starts in
// the environment, as torchrun does:
//
//   rlx::dist::StoreServer store;                 // an ephemeral port on 127.0.0.1
//   env: RLX_RANK=r RLX_WORLD_SIZE=n RLX_STORE=127.0.0.1:<store.port()>
//   ... in each rank: auto comm = rlx::dist::connect(rlx::dist::rendezvous_from_env());
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace rlx::dist {

// This host's name (gethostname), as peers on other hosts reach it.
std::string host_name();
// The tcp:// endpoint another process wrote to `file` once it listened, waiting for the
// file up to timeout_s (rlx::Error naming the file otherwise, or what it holds).
std::string wait_endpoint_file(const std::filesystem::path& file, double timeout_s);

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_host = "127.0.0.1";  // where the TCPStore listens
  int store_port = 0;                    // 0 with host_store: an ephemeral port (world_size 1 only)
  bool host_store = false;               // this rank hosts the store (usually rank 0 without a launcher)
  std::string interface_host = "127.0.0.1";  // the address Gloo binds for its connections
  double timeout_s = 300;                // every collective
  double connect_timeout_s = 120;        // joining the group
  double heartbeat_s = 0.5;              // liveness beats through the store, for diagnosing failures
  bool nccl = false;                     // NCCL (ranks on CUDA devices) instead of Gloo; RLX_COMM_BACKEND=nccl
  std::string prefix;                    // the group's keys in the store (several groups, or generations, share one)
};

// From RLX_RANK, RLX_WORLD_SIZE, RLX_STORE (host:port), RLX_STORE_HOST_SELF (1: this
// rank hosts the store), RLX_COMM_TIMEOUT_S, RLX_COMM_INTERFACE and RLX_COMM_BACKEND
// (gloo or nccl; unset: the caller's choice). Without
// RLX_WORLD_SIZE: a group of one. Malformed values throw rlx::Error naming the variable.
RendezvousOptions rendezvous_from_env();

// Where a launcher that hosts the store writes how rank `rank`'s process ended (removed when
// its replacement has joined a re-formed group): a failed collective's diagnosis names that
// rank as ended at once.
std::string exit_key(int rank);
// Records exit_key(rank) = `how` in the store at `store` (host:port) that another process
// hosts (a task's launcher under Slurm); a store out of reach is logged, not thrown.
void record_exit(const std::string& store, int rank, const std::string& how);
// "host:port" split; `what` names the value in the error when it is not that.
std::pair<std::string, int> store_address(const std::string& address, std::string_view what);

// A TCPStore server owned by a launcher.
class StoreServer {
 public:
  explicit StoreServer(const std::string& host = "127.0.0.1", int port = 0);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;
  const std::string& host() const { return host_; }
  // Keys of the store itself (outside any group's prefix), such as exit_key().
  void set(const std::string& key, const std::string& value);

 private:
  struct Impl;
  std::string host_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlx::dist
