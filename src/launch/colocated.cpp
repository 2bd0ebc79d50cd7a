// The rollout half of a colocated learner (colocated.hpp).
#include "colocated.hpp"

#include <fmt/format.h>

#include <string>

#include "rlx/bus/client.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/log.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/rl/worker.hpp"
#include "worker_envs.hpp"

namespace rlx::launch {

using nlohmann::json;

ColocatedRollout::ColocatedRollout(const RoleContext& ctx, std::shared_ptr<Transformer> model,
                                   std::shared_ptr<const Tokenizer> tok, dist::WeightLayout layout)
    : ctx_(ctx),
      overlap_(ctx.cfg.train.mode == TrainMode::async),
      tok_(tok),
      engine_(std::make_unique<Engine>(std::move(model), engine_config(ctx.cfg), std::move(tok))),
      weights_(*engine_, std::move(layout), /*staged=*/overlap_),
      turns_({.on_switch = rl::kv_handover(*engine_)}) {
  env::register_bundled();  // the worker's environments (a trainer's own were registered by its main)
  last_at_ = now_s();
}

ColocatedRollout::~ColocatedRollout() {
  try {
    finish();
  } catch (const std::exception& e) {
    log::warn("colocated worker: {}", e.what());
  }
}

void ColocatedRollout::start(std::atomic<bool>& stop) {
  thread_ = std::thread([this, &stop] {
    try {
      const std::string who = "worker-0";
      WorkerEnvs envs(ctx_, tok_, [this] { return end_.load(); }, [] { return false; });
      bus::Client client({.address = ctx_.hub_address(), .who = who});
      client.give_up_when([this] { return end_.load() || launcher_gone(); });
      auto options = worker_options(ctx_, who, engine_->model_config().vocab_size);
      options.turns = turns();
      rl::Worker* self = nullptr;
      options.after_round = [this, &self] {
        generated_s_ = self->busy_s();
        const auto st = engine_->stats();
        graph_steps_ = st.graph_steps;
        graph_captures_ = st.graph_captures;
        graph_capture_s_ = st.graph_capture_s;
      };
      rl::Worker worker(std::move(options), *engine_, envs.source(), client, weights_);
      self = &worker;
      static const std::atomic<bool> never{false};  // a colocated worker does not leave on its own
      const int64_t sent = worker.run(end_, never);
      client.close(end_ ? 5 : 30);
      log::info("{} (colocated): {} groups sent", who, sent);
    } catch (...) {
      error_ = std::current_exception();
      failed_ = true;
      stop = true;  // the learner's loop ends; finish() rethrows this
    }
  });
}

void ColocatedRollout::finish() {
  end_ = true;
  if (thread_.joinable()) thread_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ColocatedRollout::add_metrics(json& line) {
  const auto now = turns_.totals();
  const double t = now_s(), wall = std::max(t - last_at_, 1e-9);
  constexpr int gen = static_cast<int>(DeviceTurns::Use::generate), train = static_cast<int>(DeviceTurns::Use::train);
  const double done = generated_s_.load();
  // With turns, what each use held; overlapping, the worker's rollout seconds and the
  // learner's train and publish seconds (their sum, capped: the device's busy share is at
  // most that when they overlap).
  const double generate = overlap_ ? done - last_generated_s_ : now.held_s[gen] - last_.held_s[gen];
  const double training = overlap_ ? line.value("train_s", 0.0) + line.value("sync_s", 0.0)
                                   : now.held_s[train] - last_.held_s[train];
  last_generated_s_ = done;
  line["generate_s"] = generate;
  line["busy_device"] = std::min(1.0, (generate + training) / wall);
  line["busy_worker_0"] = std::min(1.0, generate / wall);
  line["busy_rollout"] = std::min(1.0, generate / wall);
  line["weight_copy_s"] = weights_.last_copy_s();
  line["kv_pool_mb"] = static_cast<double>(engine_->kv_pool_bytes()) / (1024.0 * 1024.0);
  const int64_t steps = graph_steps_, captures = graph_captures_;
  const double capture_s = graph_capture_s_;
  line["graph_steps"] = steps - last_graph_steps_;
  line["graph_captures"] = captures - last_graph_captures_;
  line["graph_capture_s"] = capture_s - last_graph_capture_s_;
  last_graph_steps_ = steps;
  last_graph_captures_ = captures;
  last_graph_capture_s_ = capture_s;
  last_ = now;
  last_at_ = t;
}

}  // namespace rlx::launch
