// The learner's step loop (rl/loop.hpp).
#include "rlx/rl/loop.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/learner/batching.hpp"
#include "rlx/learner/sample_stats.hpp"

namespace rlx::rl {

using nlohmann::json;

namespace {

// Rank 0's value on every rank.
int64_t broadcast_value(dist::Communicator& comm, int64_t value, const char* what) {
  if (comm.size() == 1) return value;
  auto t = at::tensor({value}, at::kLong);
  comm.broadcast(t, 0, what)->wait();
  return t.item<int64_t>();
}

// Rank 0's batch on every rank: its head and group frames as they came from the hub, which
// each rank checks and reads in place.
bus::BatchView broadcast_batch(dist::Communicator& comm, bus::BatchView batch) {
  auto bytes = std::make_shared<std::string>();
  if (comm.rank() == 0) *bytes = bus::pack_batch(batch);
  const auto n = broadcast_value(comm, static_cast<int64_t>(bytes->size()), "learner: batch size");
  RLX_CHECK(n >= 0 && n <= (int64_t{1} << 34), "learner: a batch of {} bytes", n);
  bytes->resize(static_cast<size_t>(n));
  auto t = at::from_blob(bytes->data(), {n}, at::kByte);
  comm.broadcast(t, 0, "learner: batch")->wait();
  if (comm.rank() == 0) return batch;
  // Rank 0's client held the frames to its own max_frame_mb; here, its largest setting.
  return bus::unpack_batch(std::move(bytes), bus::Limits{.max_frame_bytes = uint64_t{4096} << 20});
}

// This rank's share of a step's batch: its groups' sequences (tokens, loss masks,
// behaviour log-probs, routing), rewards, group sizes and truncation marks, and the whole
// batch's sample versions, token count and sample statistics.
struct RankShare {
  std::vector<Sequence> seqs;
  std::vector<double> rewards;
  std::vector<size_t> sizes;
  std::vector<uint8_t> truncated;  // cut by max_new_tokens (algorithm.mask_truncated)
  int64_t vmin = INT64_MAX, vmax = -1, tokens = 0;
  SampleStats stats;  // finish reasons, environment counters, a reward model's parts: the whole batch
};

// A sample as a sequence to train.
Sequence to_sequence(const bus::SampleView& t) {
  Sequence sq;
  sq.tokens.resize(t.tokens.size());
  for (size_t i = 0; i < t.tokens.size(); ++i) sq.tokens[i] = t.tokens[i];
  t.loss_mask.append_to(sq.loss_mask);
  t.logprobs.append_to(sq.values["behaviour_logprobs"]);
  if (!t.routing.empty()) {
    t.routing.experts.append_to(sq.routing);
    sq.routing_layers = t.routing.layers, sq.routing_top_k = t.routing.top_k;
  }
  return sq;
}

// Groups in prompt order: the step does not depend on which worker finished first; the
// ranks share them balanced by tokens.
RankShare share_of_rank(const bus::BatchView& batch, int rank, int world) {
  const auto order = prompt_order(batch);
  std::vector<int64_t> group_tokens;
  for (const size_t i : order) group_tokens.push_back(batch.groups[i].num_tokens());
  const auto rank_of = assign_ranks(group_tokens, static_cast<uint32_t>(world));
  RankShare share;
  for (size_t gi = 0; gi < order.size(); ++gi) {
    const auto& g = batch.groups[order[gi]];
    const auto [lo_v, hi_v] = g.version_range();
    if (lo_v >= 0) share.vmin = std::min(share.vmin, lo_v), share.vmax = std::max(share.vmax, hi_v);
    share.tokens += g.num_tokens();
    for (const auto& t : g.samples) share.stats.add(t.finish, t.metadata);
    if (static_cast<int>(rank_of[gi]) != rank) continue;
    share.sizes.push_back(g.samples.size());
    for (const auto& t : g.samples) {
      share.rewards.push_back(t.reward);
      share.truncated.push_back(t.finish == "length" ? 1 : 0);
      share.seqs.push_back(to_sequence(t));
    }
  }
  return share;
}

// Seconds a step spent in its phases.
struct StepTimes {
  double wait_s = 0;   // for the batch
  double train_s = 0;  // training it
  double sync_s = 0;   // gathering and publishing the weights, on_weights not counted
};

// Rank 0: a trained step's metrics line (time_s, checkpoint_s and the error counts are
// added when it is reported).
json step_line(int64_t step, const bus::BatchView& batch, int world, const RankShare& share, const StepTimes& times,
               int64_t sync_bytes, const algo::Metrics& m, const json& extra) {
  const auto vmin = share.vmin, vmax = share.vmax;
  json line = {{"step", step},
               {"groups", batch.groups.size()},
               {"learner_ranks", world},
               {"sequence_tokens", share.tokens},  // prompts, actions and observations
               {"sample_version_min", vmin == INT64_MAX ? -1 : vmin},
               {"sample_version_max", vmax},
               {"version_lag", vmin == INT64_MAX ? 0 : step - 1 - vmin},  // trained version minus oldest sample
               {"wait_s", times.wait_s},
               {"train_s", times.train_s},
               {"sync_s", times.sync_s},
               {"sync_bytes", sync_bytes}};  // what the publisher wrote for this version
  for (const auto& [k, v] : m) line[k] = v;
  for (const auto& [k, v] : extra.items()) line[k] = v;
  share.stats.add_to(line);
  return line;
}
}  // namespace

std::vector<size_t> prompt_order(const bus::BatchView& batch) {
  std::vector<size_t> order(batch.groups.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const auto &a = batch.groups[x], &b = batch.groups[y];
    return std::tie(a.epoch, a.prompt_index) < std::tie(b.epoch, b.prompt_index);
  });
  return order;
}

LearnerLoop::LearnerLoop(LoopOptions options, LoopParts parts) : o_(std::move(options)), p_(std::move(parts)) {
  RLX_CHECK(p_.comm.rank() != 0 || p_.client, "learner loop: rank 0 needs a hub client");
  RLX_CHECK(o_.groups_per_step >= static_cast<uint32_t>(p_.comm.size()),
            "learner loop: {} groups per step cannot feed {} ranks", o_.groups_per_step, p_.comm.size());
}

void LearnerLoop::say(const std::string& what) const {
  if (o_.status) o_.status(what);
}

void LearnerLoop::add_error_counts(json& line) {
  std::vector<std::pair<std::string, double>> stats;
  try {
    stats = p_.client->hub_stats();
  } catch (const Error& e) {  // the metrics go on without them; the batch requests say if the hub is gone
    if (!said_no_stats_) log::warn("learner: no error counts from the hub: {}", e.what());
    said_no_stats_ = true;
    return;
  }
  double rejected = 0, worker = 0;
  for (const auto& [k, v] : stats) {
    if (k.rfind("lease_errors_", 0) == 0) line["errors_" + k.substr(13)] = v;
    if (k.rfind("rejected_", 0) == 0) rejected += v;
    if (k == "worker_errors") worker = v;
  }
  line["errors_worker_reported"] = worker;
  line["errors_rejected"] = rejected;
}

LearnerLoop::End LearnerLoop::run(int64_t& step, const std::atomic<bool>& stop) {
  t_start_ = now_s();
  published_ = reported_ = step;  // a resumed run's version was published before the loop
  for (;;) {
    try {
      if (auto end = step_once(step, stop)) return *end;
    } catch (const dist::CommError& e) {
      if (!p_.recover) throw;
      recover(step, e);
    }
  }
}

void LearnerLoop::recover(int64_t& step, const dist::CommError& e) {
  const int64_t failed_at = step;
  const int64_t restored = p_.recover(e);  // collective; rethrows when the group cannot re-form
  if (p_.comm.rank() == 0) {
    while (!kept_.empty() && kept_.front().step <= restored) kept_.pop_front();
    // Every step after the checkpoint must be trained again, from rank 0's copies.
    const bool have = kept_.empty() ? failed_at <= restored : kept_.front().step == restored + 1;
    RLX_CHECK(have, "learner: the group re-formed at the checkpoint of step {}, but rank 0 no longer holds the "
              "batches of the steps after it (it keeps those since its last checkpoint); the run restarts from "
              "that checkpoint", restored);
    replay_ = 0;
    if (!kept_.empty())
      log::warn("learner: training steps {}..{} again from the batches kept since the checkpoint of step {}",
                kept_.front().step, kept_.back().step, restored);
  }
  // A step whose checkpoint committed before the group broke is reported now; a later one
  // is trained again, and reported then.
  if (pending_ && pending_->step <= restored) report(0);
  pending_.reset();
  step = restored;
  saved_ = true;  // the state is the checkpoint's: a stop now need not save it again
}

void LearnerLoop::report(double t_ckpt) {
  auto& [step, line, t0, busy_s, tokens] = *pending_;
  const double step_s = std::max(now_s() - t0, 1e-9);
  line["time_s"] = now_s() - t_start_;
  line["checkpoint_s"] = t_ckpt;
  line["step_s"] = step_s;
  line["tokens_per_s"] = tokens / step_s;
  // the learner's share of the step spent working (training, publishing, checkpointing)
  line["busy_learner"] = (busy_s + t_ckpt) / step_s;
  add_error_counts(line);
  reported_ = step;
  if (o_.on_step) o_.on_step(step, line);
  pending_.reset();
}

LearnerLoop::Decision LearnerLoop::take_batch(int64_t step, const std::atomic<bool>& stop, double t0,
                                              bus::BatchView& batch) {
  if (replay_ < kept_.size()) {  // training again after the group re-formed
    RLX_ASSERT(kept_[replay_].step == step + 1, "the kept batches are in step order");
    batch = kept_[replay_++].batch;
    return kTrain;
  }
  const int world = p_.comm.size();
  Decision what = kTrain;
  if (step >= o_.steps) what = kEnd;
  while (what == kTrain && !stop) {
    try {
      batch = p_.client->next_batch_view({.max_groups = o_.groups_per_step}, 1.0);
      break;
    } catch (const bus::TimeoutError&) {
      RLX_CHECK(now_s() - t0 < o_.batch_timeout_s, "learner: no batch from the hub within {} s (step {})",
                o_.batch_timeout_s, step + 1);
    }
  }
  if (what == kTrain && batch.groups.empty()) {
    if (stop) {
      what = kStop;
    } else {
      RLX_CHECK(batch.end, "learner: the hub sent an empty batch that is not the end");
      log::info("learner: the hub has no more groups; stopping at step {}", step);
      what = kEnd;
    }
  }
  RLX_CHECK(what != kTrain || batch.groups.size() >= static_cast<size_t>(world),
            "learner: a batch of {} groups cannot feed {} ranks", batch.groups.size(), world);
  // Kept until a checkpoint holds its step, to be trained again if the group re-forms.
  if (what == kTrain && p_.recover && o_.checkpoint_every > 0) {
    kept_.push_back({step + 1, batch});
    replay_ = kept_.size();
  }
  return what;
}

LearnerLoop::Published LearnerLoop::publish_weights(int64_t step, const Weights& params, DeviceTurns::Turn& turn) {
  const bool lead = p_.comm.rank() == 0;
  say(fmt::format("publishing weights v{}", step));
  Published out;
  // A step trained again after the group re-formed: its version is out already.
  const bool fresh = step > published_;
  if (lead && p_.publisher && fresh) out.sync_bytes = p_.publisher->publish(step, params);
  // Split: the workers learn of the version before on_weights (they roll out while rank 0
  // validates); colocated, the engine waits for the device, held until on_weights returns.
  if (lead && fresh && !p_.turns) p_.client->publish_version(step);
  if (lead && fresh && o_.on_weights) {
    const double t = now_s();
    o_.on_weights(step, params, out.extra);
    out.hook_s = now_s() - t;
  }
  turn.release();
  if (lead && fresh && p_.turns) p_.client->publish_version(step);
  published_ = std::max(published_, step);
  return out;
}

void LearnerLoop::checkpoint_if_due(int64_t step) {
  if (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0 && p_.checkpoint) {
    RLX_TRACE_SCOPE("checkpoint");
    p_.checkpoint(step, trained_batch_);
    saved_ = true;
    while (!kept_.empty() && kept_.front().step <= step) kept_.pop_front(), replay_ -= replay_ > 0 ? 1 : 0;
  }
}

std::optional<LearnerLoop::End> LearnerLoop::step_once(int64_t& step, const std::atomic<bool>& stop) {
  auto& comm = p_.comm;
  const bool lead = comm.rank() == 0;
  const int world = comm.size();
  const double t0 = now_s();
  const int64_t t0_us = TraceWriter::now_us();
  // Rank 0 takes the batch (waiting in slices so that SIGINT/SIGTERM is noticed while
  // rollout is slow) and decides for every rank: train it, or stop.
  bus::BatchView batch;  // its groups read in place from the frames the hub sent
  say(lead ? fmt::format("waiting for a batch of {} groups from the hub (step {})", o_.groups_per_step, step + 1)
           : fmt::format("waiting for rank 0's batch (step {})", step + 1));
  const int64_t what =
      broadcast_value(comm, lead ? take_batch(step, stop, t0, batch) : kTrain, "learner: train or stop");
  if (what == kStop) return End::stopped;
  if (what == kEnd) return step >= o_.steps ? End::steps : End::exhausted;
  StepTimes times{.wait_s = now_s() - t0};
  trace_span("wait_batch", t0_us);
  if (world > 1) batch = broadcast_batch(comm, std::move(batch));
  RankShare share = share_of_rank(batch, comm.rank(), world);
  if (lead && o_.on_batch && step + 1 > reported_) o_.on_batch(step + 1, batch);  // not a step trained again
  // Colocated: the device is ours from training to the published weights (the worker
  // generates outside this turn).
  DeviceTurns::Turn turn;
  if (p_.turns) {
    say(fmt::format("waiting for the device (the rollout engine generates) for step {}", step + 1));
    turn = p_.turns->hold(DeviceTurns::Use::train, &stop);
    if (!turn) return End::stopped;
  }
  const double t1 = now_s();
  const int64_t t1_us = TraceWriter::now_us();
  say(fmt::format("training step {}", step + 1));
  if (o_.on_rewards) {
    const size_t n = share.rewards.size();
    o_.on_rewards(step + 1, share.rewards, share.sizes);
    RLX_CHECK(share.rewards.size() == n, "a trainer's on_rewards hook changed the number of rewards ({} -> {})", n,
              share.rewards.size());
  }
  auto m = train_on_batch(p_.algorithm, p_.models, share.seqs, share.rewards, share.sizes, share.truncated);
  times.train_s = now_s() - t1;
  trace_span("train", t1_us);
  ++step;
  trained_batch_ = batch.batch_id;
  const auto params = p_.models.policy.model().sync_parameters(o_.weights_dtype);  // collective; with LoRA the adapters
  const double t2 = now_s();
  const int64_t t2_us = TraceWriter::now_us();
  const Published published = publish_weights(step, params, turn);
  times.sync_s = now_s() - t2 - published.hook_s;
  trace_span("publish_weights", t2_us);
  saved_ = false;
  if (lead && step > reported_)  // a step trained again after the group re-formed was reported
    pending_ = Pending{step, step_line(step, batch, world, share, times, published.sync_bytes, m, published.extra), t0,
                       times.train_s + times.sync_s, static_cast<double>(share.tokens)};
  const double t3 = now_s();
  checkpoint_if_due(step);
  if (auto* t = TraceWriter::installed()) t->flush();
  if (pending_) report(now_s() - t3);
  return std::nullopt;
}

}  // namespace rlx::rl
