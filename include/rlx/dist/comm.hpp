// Collectives between the ranks of a learner group: all-gather, reduce-scatter,
// all-reduce, broadcast and barrier on tensors, each bounded by a timeout.
//
// The backend is Gloo through LibTorch's c10d, or NCCL (c10d's ProcessGroupNCCL, where
// rlx is built with it) for ranks on CUDA devices; ranks meet through a c10d TCPStore
// (rendezvous.hpp). A collective that cannot finish (a peer killed,
// stopped or partitioned) throws CommError within the timeout, and the message
// names this rank, the operation, and which peers stopped heart-beating:
//
//   rank 0: all_gather "layer 3 weights" failed after 0.2 s (Connection closed by peer
//   [127.0.0.1]:40211); rank 1 is not responding (no heartbeat for 1.5 s)
//
// or, when the launcher that hosts the store saw the process end (exit_key()):
//   ...; rank 1 ended (killed by signal 9 (Killed))
//
//   auto comm = rlx::dist::connect(rlx::dist::rendezvous_from_env());
//   at::Tensor full = at::empty({comm->size() * n});
//   comm->all_gather(full, shard, "weights")->wait();
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "rlx/core/error.hpp"
#include "rlx/dist/rendezvous.hpp"

namespace rlx::dist {

// A collective that failed or timed out; the message says which rank, which
// operation, and what is known about the peers.
class CommError : public Error {
 public:
  using Error::Error;
};

enum class ReduceOp { sum, max };

// A collective in flight. wait() returns when it is done (its outputs are then
// valid) or throws CommError once the communicator's timeout has passed.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // Every rank passes `in` of n elements and `out` of size() * n elements (both
  // contiguous, same dtype); rank r's input lands in out[r*n, (r+1)*n).
  virtual std::unique_ptr<Work> all_gather(const at::Tensor& out, const at::Tensor& in, std::string_view what) = 0;
  // Every rank passes `in` of size() * n elements; `out` (n elements) receives the
  // sum over ranks of their in[rank*n, (rank+1)*n), added in rank order (deterministic).
  virtual std::unique_ptr<Work> reduce_scatter(const at::Tensor& out, const at::Tensor& in, std::string_view what) = 0;
  // In place.
  virtual std::unique_ptr<Work> all_reduce(const at::Tensor& t, ReduceOp op, std::string_view what) = 0;
  // In place: every rank ends with root's values.
  virtual std::unique_ptr<Work> broadcast(const at::Tensor& t, int root, std::string_view what) = 0;
  virtual void barrier(std::string_view what) = 0;
};

// A communicator of one rank (collectives are copies); what a single process uses.
std::unique_ptr<Communicator> single_process();

// Whether this rlx was built with NCCL (RendezvousOptions::nccl).
bool nccl_available();

// Makes `device` the calling thread's current CUDA device, which an NCCL group takes for what
// names no tensor (its barrier): a thread running collectives on cuda:N calls it first. A CPU
// device, or a build without NCCL: nothing.
void use_device_for_collectives(const at::Device& device);

// Joins the group described by `options` (blocking until every rank has joined,
// bounded by options.connect_timeout_s). One rank per process.
std::unique_ptr<Communicator> connect(const RendezvousOptions& options);

// A group that outlives the death of a rank, as the learner group does under `rlx run`:
// after a collective failed (CommError), reform() drops the broken process group and
// joins the next generation with the same ranks, the dead one's replacement included
// (the launcher restarts it with the same RLX_RANK). Generation g meets under the store
// prefix `<prefix>gen/<g>/`; rank 0 records each generation that formed, and a rank that
// starts while the group exists (a replacement) joins the one after it. Every rank's
// state (what the dead rank held is gone) is the caller's to restore after reform().
//
//   auto comm = rlx::dist::connect_reformable(rlx::dist::rendezvous_from_env());
//   try { ... comm->all_reduce(t, ReduceOp::sum, "loss")->wait(); }
//   catch (const CommError&) { if (!comm->broken()) throw; comm->reform(); /* restore */ }
class ReformableGroup : public Communicator {
 public:
  // The generation this rank is in.
  virtual int64_t generation() const = 0;
  // Whether a collective of this generation failed (a CommError came from this group,
  // not from another one, such as a weight broadcast's).
  virtual bool broken() const = 0;
  // Leaves this generation and joins the next, waiting for every rank (at least the
  // collective timeout: a survivor may notice the failure only at its next collective).
  // Throws CommError when the group does not form.
  virtual void reform() = 0;
  // Rank 0, at the end: the group is done, and a rank still waiting to join (a replacement
  // started as the others finished) stops waiting; finished() is then true there.
  virtual void finish() = 0;
  // This rank found the group finished instead of joining it (it has no collectives).
  virtual bool finished() const = 0;
};

// The store must be the launcher's (not hosted by rank 0: it would go with rank 0).
std::unique_ptr<ReformableGroup> connect_reformable(const RendezvousOptions& options);

}  // namespace rlx::dist
