// The rollout worker (rl/worker.hpp): leases -> episodes -> groups.
#include "rlx/rl/worker.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <stop_token>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/env/server.hpp"

namespace rlx::rl {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// Routing in an episode checkpoint: four hex digits an int16 (its two bytes little-endian).
std::string routing_hex(const std::vector<int16_t>& values) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(values.size() * 4, '0');
  for (size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<uint16_t>(values[i]);
    const uint8_t bytes[2] = {static_cast<uint8_t>(v & 0xff), static_cast<uint8_t>(v >> 8)};
    for (int b = 0; b < 2; ++b) {
      out[i * 4 + static_cast<size_t>(2 * b)] = kDigits[bytes[b] >> 4];
      out[i * 4 + static_cast<size_t>(2 * b) + 1] = kDigits[bytes[b] & 0xf];
    }
  }
  return out;
}
std::vector<int16_t> routing_from_hex(const std::string& hex) {
  RLX_CHECK(hex.size() % 4 == 0, "routing of {} hex digits (four a value)", hex.size());
  const auto digit = [&](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    throw Error(fmt::format("routing: {:?} is not a hex digit", c));
  };
  std::vector<int16_t> out(hex.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned lo = digit(hex[4 * i]) << 4 | digit(hex[4 * i + 1]), hi = digit(hex[4 * i + 2]) << 4 | digit(hex[4 * i + 3]);
    out[i] = static_cast<int16_t>(static_cast<uint16_t>(hi << 8 | lo));
  }
  return out;
}

// Values per token of a group's routing (0: a dense model).
size_t routing_width(const GroupRollout& g) { return static_cast<size_t>(g.routing_layers) * g.routing_top_k; }

// A turn's routing into its episode's (its tokens so far, the request's prompt): the
// prompt's rows the engine recorded (a token's latest forward replaces an earlier one's,
// as after a weight update the engine computes the context anew), then the action's.
void add_routing(std::vector<int16_t>& episode, const GenerationResult& r, const SampleOutput& out) {
  if (r.prompt_routing.empty()) return;
  RLX_ASSERT(episode.size() == r.prompt_routing.size(), "an episode's routing ({} values) is not its prompt's ({})",
             episode.size(), r.prompt_routing.size());
  for (size_t i = 0; i < episode.size(); ++i)
    if (r.prompt_routing[i] >= 0) episode[i] = r.prompt_routing[i];
  episode.insert(episode.end(), out.routing.begin(), out.routing.end());
}
}  // namespace

fs::path EpisodeCheckpoints::file(const bus::Lease& l) const { return dir_ / fmt::format("p{}.e{}", l.prompt_index, l.epoch); }

void EpisodeCheckpoints::remove(const bus::Lease& l) {
  std::error_code ec;
  fs::remove(file(l), ec);
}

void EpisodeCheckpoints::save(const GroupRollout& g, int next_turn) {
  json samples = json::array();
  for (size_t k = 0; k < g.episodes.size(); ++k) {
    samples.push_back({{"episode", g.episodes[k].to_json()}, {"env_state", g.envs[k]->save_state()},
                       {"versions", g.versions[k]}, {"truncated", k < g.truncated.size() && g.truncated[k] != 0}});
    if (routing_width(g) > 0) samples.back()["routing"] = routing_hex(g.routing[k]);
  }
  const auto body = json{{"format", "rlx-episodes/2"}, {"prompt_index", g.lease.prompt_index}, {"epoch", g.lease.epoch},
                         {"task_xxh64", hash_name(g.lease.task)}, {"next_turn", next_turn},
                         {"routing_layers", g.routing_layers}, {"routing_top_k", g.routing_top_k}, {"samples", samples}}
                        .dump();
  fs::create_directories(dir_);
  write_file_atomic(file(g.lease), fmt::format("{:016x}\n{}", hash_name(body), body));
  ++saved_;
}

bool EpisodeCheckpoints::restore(GroupRollout& g, const EnvSource& envs) {
  const auto path = file(g.lease);
  if (every_ == 0 || !fs::exists(path)) return false;
  try {
    const auto text = read_file(path, uint64_t{1} << 30);
    const auto nl = text.find('\n');
    RLX_CHECK(nl == 16, "no checksum line");
    const std::string_view body = std::string_view(text).substr(17);
    RLX_CHECK(fmt::format("{:016x}", hash_name(body)) == text.substr(0, 16), "checksum mismatch (damaged file)");
    const auto j = json::parse(body);
    const bool routed = j.at("format") == "rlx-episodes/2";
    RLX_CHECK(routed || j.at("format") == "rlx-episodes/1", "unknown format {}", j.at("format").dump());
    RLX_CHECK(j.at("prompt_index").get<uint64_t>() == g.lease.prompt_index && j.at("epoch").get<uint64_t>() == g.lease.epoch &&
                  j.at("task_xxh64").get<uint64_t>() == hash_name(g.lease.task),
              "it belongs to another task");
    const auto& samples = j.at("samples");
    RLX_CHECK(samples.size() == g.lease.group_size, "{} samples, the lease has {}", samples.size(), g.lease.group_size);
    // Routing of another shape (another model) cannot be replayed: the episode starts over.
    const auto layers = routed ? j.at("routing_layers").get<uint16_t>() : uint16_t{0};
    const auto top_k = routed ? j.at("routing_top_k").get<uint16_t>() : uint16_t{0};
    RLX_CHECK(layers * top_k == 0 || (layers == g.routing_layers && top_k == g.routing_top_k),
              "routing of {} sparse layers x top {}, this engine's is {} x {}", layers, top_k, g.routing_layers,
              g.routing_top_k);
    const size_t width = routing_width(g);
    for (const auto& s : samples) {
      g.envs.push_back(envs.make());
      g.envs.back()->load_state(s.at("env_state").get<std::string>());
      g.episodes.push_back(env::Episode::from_json(s.at("episode")));
      g.versions.push_back(s.at("versions").get<std::vector<int64_t>>());
      g.truncated.push_back(s.value("truncated", false) ? 1 : 0);
      RLX_CHECK(g.versions.back().size() == g.episodes.back().tokens.size(), "versions do not match the tokens");
      const size_t tokens = g.episodes.back().tokens.size();
      // A checkpoint without routing (a /1 file, a dense model's): none recorded so far.
      g.routing.push_back(layers * top_k > 0 ? routing_from_hex(s.at("routing").get<std::string>())
                                             : std::vector<int16_t>(tokens * width, -1));
      RLX_CHECK(g.routing.back().size() == tokens * width, "routing ({} values) does not match the {} tokens",
                g.routing.back().size(), tokens);
    }
    g.start_turn = j.at("next_turn").get<int>();
    return true;
  } catch (const FatalError&) {
    throw;  // not the checkpoint's fault: the run cannot go on
  } catch (const std::exception& e) {
    log::warn("episode checkpoint {}: {}; the episode starts over", path.string(), e.what());
    g.envs.clear(), g.episodes.clear(), g.versions.clear(), g.truncated.clear(), g.routing.clear();
    remove(g.lease);
    return false;
  }
}

namespace {
// Runs f for a group: an environment that failed (InfraError) sends the lease back to be
// retried, a task the environment rejects (Error) ends it as a data error; a FatalError
// ends the run.
template <class F>
void guarded(GroupRollout& gr, F&& f) {
  try {
    f();
  } catch (const env::InfraError& e) {
    gr.error_kind = "infra", gr.error = e.what();
  } catch (const FatalError&) {
    throw;  // the run cannot go on: not this task's fault
  } catch (const Error& e) {
    gr.error_kind = "data", gr.error = e.what();
  }
}

// The episodes a grant starts afresh, reset together (one round trip to an env server for
// them all): each one's environment, task and group.
struct FreshEpisodes {
  std::vector<env::Env*> envs;
  std::vector<const json*> tasks;
  std::vector<size_t> group;
};

// The grant's groups, each continued from its episode checkpoint or given fresh
// environments (into `fresh`, their tasks parsed into `tasks`). An environment that failed
// (InfraError) sends the lease back to be retried; a task the environment rejects ends the
// lease as a data error. A server past its restarts (envs.make() throws) ends the worker.
std::vector<GroupRollout> open_groups(Engine& engine, const EnvSource& envs, const std::vector<bus::Lease>& leases,
                                      EpisodeCheckpoints* checkpoints, std::vector<json>& tasks, FreshEpisodes& fresh) {
  std::vector<GroupRollout> groups(leases.size());
  for (size_t g = 0; g < leases.size(); ++g) {
    auto& gr = groups[g];
    gr.lease = leases[g];
    gr.routing_layers = static_cast<uint16_t>(engine.routing().layers());
    gr.routing_top_k = static_cast<uint16_t>(engine.routing().top_k());
    json& task = tasks[g];
    try {
      task = json::parse(gr.lease.task);
    } catch (const json::exception& e) {
      gr.error_kind = "data", gr.error = fmt::format("lease {}: the task is not JSON: {}", gr.lease.lease_id, e.what());
      continue;
    }
    if (checkpoints && checkpoints->restore(gr, envs)) {
      log::info("lease {} (prompt {}): continues its episodes at turn {}", gr.lease.lease_id, gr.lease.prompt_index,
                gr.start_turn);
      continue;
    }
    for (uint32_t k = 0; k < gr.lease.group_size; ++k) {
      gr.envs.push_back(envs.make());
      fresh.envs.push_back(gr.envs.back().get());
      fresh.tasks.push_back(&task);
      fresh.group.push_back(g);
    }
  }
  return groups;
}

// Resets the fresh episodes' environments together and starts each episode at its prompt.
void start_episodes(std::vector<GroupRollout>& groups, const FreshEpisodes& fresh) {
  if (fresh.envs.empty()) return;
  auto prompts = env::reset_all(fresh.envs, fresh.tasks);
  for (size_t i = 0; i < fresh.envs.size(); ++i) {
    auto& gr = groups[fresh.group[i]];
    if (!gr.error.empty()) continue;  // the group ended at an earlier sample's error (the first one is reported)
    guarded(gr, [&] {
      if (prompts[i].error) std::rethrow_exception(prompts[i].error);
      gr.episodes.emplace_back().start(std::move(prompts[i].value));
      gr.versions.emplace_back(gr.episodes.back().tokens.size(), -1);
      gr.truncated.push_back(0);
      gr.routing.emplace_back(gr.episodes.back().tokens.size() * routing_width(gr), -1);
    });
  }
}

// A turn's generation requests and whose each is: group, sample (-1: all samples).
struct TurnRequests {
  std::vector<GenerationRequest> requests;
  std::vector<std::pair<size_t, int64_t>> owner;
};

// The turn's requests: a group whose episodes all share their tokens at turn 0 asks for its
// group_size samples at once; otherwise every unfinished episode asks for one.
TurnRequests turn_requests(const std::vector<GroupRollout>& groups, int turn, const RolloutOptions& options,
                           const EnvSource& envs) {
  TurnRequests out;
  auto params = options.sampling;
  params.n = 1;
  params.stop_strings.insert(params.stop_strings.end(), envs.stop_strings.begin(), envs.stop_strings.end());
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& gr = groups[g];
    if (!gr.error.empty() || turn < gr.start_turn) continue;
    const auto& l = gr.lease;
    const bool shared = turn == 0 && std::all_of(gr.episodes.begin(), gr.episodes.end(), [&](const env::Episode& e) {
                          return e.tokens == gr.episodes[0].tokens;
                        });
    if (shared) {
      auto p = params;
      p.n = l.group_size;
      out.requests.push_back({.id = fmt::format("p{}.e{}.t0", l.prompt_index, l.epoch),
                              .prompt = gr.episodes[0].tokens,
                              .params = p,
                              .seed = options.seed});
      out.owner.emplace_back(g, -1);
      continue;
    }
    for (size_t k = 0; k < gr.episodes.size(); ++k) {
      if (gr.episodes[k].done) continue;
      out.requests.push_back({.id = fmt::format("p{}.e{}.s{}.t{}", l.prompt_index, l.epoch, k, turn),
                              .prompt = gr.episodes[k].tokens,
                              .params = params,
                              .seed = options.seed});
      out.owner.emplace_back(g, static_cast<int64_t>(k));
    }
  }
  return out;
}

// Every sample's action, to step its environment with: the environments, the actions, and
// each one's group and sample.
struct TurnActions {
  std::vector<env::Env*> stepped;
  std::vector<std::vector<TokenId>> actions;
  std::vector<std::pair<size_t, size_t>> at;
};

// The engine's samples into their episodes (action tokens, log-probs, versions, routing,
// truncation), and the actions to send to the environments.
TurnActions add_actions(std::vector<GroupRollout>& groups, std::vector<GenerationResult>& results,
                        const std::vector<std::pair<size_t, int64_t>>& owner) {
  TurnActions out;
  for (size_t r = 0; r < results.size(); ++r) {
    auto& gr = groups[owner[r].first];
    if (!gr.error.empty()) continue;
    for (size_t s = 0; s < results[r].samples.size(); ++s) {
      const size_t k = owner[r].second < 0 ? s : static_cast<size_t>(owner[r].second);
      auto& out_sample = results[r].samples[s];
      auto& ver = gr.versions[k];
      add_routing(gr.routing[k], results[r], out_sample);
      gr.episodes[k].add_action(out_sample.tokens, out_sample.logprobs);
      ver.insert(ver.end(), out_sample.versions.begin(), out_sample.versions.end());
      gr.truncated[k] = out_sample.finish == FinishReason::length ? 1 : 0;
      out.stepped.push_back(gr.envs[k].get());
      out.actions.emplace_back(out_sample.tokens.begin(), out_sample.tokens.end());
      out.at.emplace_back(owner[r].first, k);
    }
  }
  return out;
}

// The environments' answers into their episodes: reward, done, info, and the observation
// of an episode that goes on.
void add_steps(std::vector<GroupRollout>& groups, std::vector<env::Outcome<env::StepResult>>& steps,
               const std::vector<std::pair<size_t, size_t>>& at) {
  for (size_t i = 0; i < steps.size(); ++i) {
    auto& gr = groups[at[i].first];
    if (!gr.error.empty()) continue;  // the group ended at an earlier sample's error
    auto& ep = gr.episodes[at[i].second];
    auto& ver = gr.versions[at[i].second];
    guarded(gr, [&] {
      if (steps[i].error) std::rethrow_exception(steps[i].error);
      auto& step = steps[i].value;
      ++ep.turns;
      ep.reward += step.reward;
      ep.done = step.done;
      ep.info.push_back(std::move(step.info));
      if (!ep.done) {
        ep.add_observation(step.observation);
        ver.resize(ep.tokens.size(), -1);
        gr.routing[at[i].second].resize(ep.tokens.size() * routing_width(gr), -1);
      }
    });
  }
}

// Saves the unfinished episodes of the groups that ran `turn` (to go on at turn + 1);
// whether any was saved.
bool save_episodes(std::vector<GroupRollout>& groups, int turn, EpisodeCheckpoints& checkpoints) {
  bool saved = false;
  for (auto& gr : groups) {
    if (!gr.error.empty() || turn < gr.start_turn ||
        std::all_of(gr.episodes.begin(), gr.episodes.end(), [](const env::Episode& e) { return e.done; }))
      continue;
    try {
      checkpoints.save(gr, turn + 1);
      saved = true;
    } catch (const env::InfraError& e) {  // a remote environment's state could not be read
      gr.error_kind = "infra", gr.error = e.what();
    }
  }
  return saved;
}

}  // namespace

std::vector<GroupRollout> rollout_groups(Engine& engine, const EnvSource& envs, const std::vector<bus::Lease>& leases,
                                         const RolloutOptions& options, EpisodeCheckpoints* checkpoints,
                                         const std::function<void()>& after_checkpoint, const std::atomic<bool>* stop) {
  const int64_t start_us = TraceWriter::now_us();
  std::vector<json> tasks(leases.size());
  FreshEpisodes fresh;
  auto groups = open_groups(engine, envs, leases, checkpoints, tasks, fresh);
  start_episodes(groups, fresh);
  for (int turn = 0; turn < options.max_turns; ++turn) {
    auto [requests, owner] = turn_requests(groups, turn, options, envs);
    if (requests.empty()) {
      // Nothing to sample at this turn: done, unless groups continued from a checkpoint
      // start at a later one (every group of the grant was continued).
      const bool later = std::any_of(groups.begin(), groups.end(),
                                     [&](const GroupRollout& gr) { return gr.error.empty() && turn < gr.start_turn; });
      if (later) continue;
      break;
    }
    if (turn == 0) trace_span("start_envs", start_us);
    const int64_t gen_us = TraceWriter::now_us();
    auto results = engine.generate(std::move(requests), stop);
    trace_span("generate", gen_us);
    if (stop && *stop) {  // the samples are cut short: nothing of these groups may be sent
      for (auto& gr : groups)
        if (gr.error.empty()) gr.error_kind = "infra", gr.error = "the worker was stopped";
      return groups;
    }
    const int64_t env_us = TraceWriter::now_us();
    // Every sample's action to its environment, the calls in flight together.
    const auto acted = add_actions(groups, results, owner);
    auto steps = env::step_all(acted.stepped, acted.actions);
    add_steps(groups, steps, acted.at);
    trace_span("env_step", env_us);
    // Unfinished episodes are saved every K turns (not after the last one).
    if (!checkpoints || !checkpoints->due(turn + 1) || turn + 1 >= options.max_turns) continue;
    if (save_episodes(groups, turn, *checkpoints) && after_checkpoint) after_checkpoint();
  }
  return groups;
}

void score_episodes(std::vector<GroupRollout>& groups, const WorkerOptions& o) {
  if (!o.score) return;
  std::vector<std::vector<int64_t>> seqs;
  std::vector<env::Episode*> eps;
  std::vector<std::pair<double, double>*> parts;
  for (auto& gr : groups) {
    if (!gr.error.empty()) continue;
    gr.reward_parts.assign(gr.episodes.size(), {0.0, 0.0});
    for (size_t k = 0; k < gr.episodes.size(); ++k) {
      seqs.emplace_back(gr.episodes[k].tokens.begin(), gr.episodes[k].tokens.end());
      eps.push_back(&gr.episodes[k]);
      parts.push_back(&gr.reward_parts[k]);
    }
  }
  if (seqs.empty()) return;
  const int64_t t0 = TraceWriter::now_us();
  std::vector<double> scores;
  try {
    scores = o.score(seqs);
  } catch (const Error& e) {  // the groups go back to the hub, their leases retried
    for (auto& gr : groups)
      if (gr.error.empty()) gr.error_kind = "infra", gr.error = fmt::format("reward model: {}", e.what());
    return;
  }
  RLX_ASSERT(scores.size() == eps.size(), "a reward model returned {} scores for {} episodes", scores.size(), eps.size());
  for (size_t i = 0; i < eps.size(); ++i) {
    *parts[i] = {eps[i]->reward, scores[i]};
    eps[i]->reward = o.env_coef * eps[i]->reward + o.score_coef * scores[i];
  }
  trace_span("reward_model", t0);
}

namespace {
// The first `max` bytes of `s`, not cutting a UTF-8 sequence.
std::string utf8_prefix(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// A trajectory's metadata (worker.hpp, to_trajectory_group): the environment's counters
// summed over the turns, its last turn's text values, and a reward model's parts.
json trajectory_metadata(const env::Episode& ep, const std::pair<double, double>* reward_parts) {
  json meta = json::object(), counters = json::object(), text = json::object();
  for (const auto& info : ep.info) {
    if (!info.is_object()) continue;
    for (const auto& [key, value] : info.items()) {
      if (!(value.is_number() || value.is_boolean()) || key.size() > 64) continue;
      if (!counters.contains(key) && counters.size() >= kMaxEnvCounters) continue;
      const double v = value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>();
      if (!std::isfinite(v)) continue;
      counters[key] = counters.value(key, 0.0) + v;
    }
  }
  if (!ep.info.empty() && ep.info.back().is_object())
    for (const auto& [key, value] : ep.info.back().items())
      if (value.is_string() && key.size() <= 64 && text.size() < kMaxInfoTexts)
        text[key] = utf8_prefix(value.get<std::string>(), kMaxInfoText);
  if (!counters.empty()) meta["env"] = std::move(counters);
  if (!text.empty()) meta["info"] = std::move(text);
  if (reward_parts) meta["reward_env"] = reward_parts->first, meta["reward_model"] = reward_parts->second;
  return meta;
}
}  // namespace

bus::TrajectoryGroup to_trajectory_group(GroupRollout& gr, const std::string& worker) {
  bus::TrajectoryGroup group{.lease_id = gr.lease.lease_id, .prompt_index = gr.lease.prompt_index,
                             .epoch = gr.lease.epoch, .worker = worker};
  for (size_t k = 0; k < gr.episodes.size(); ++k) {
    auto& ep = gr.episodes[k];
    bus::Trajectory t;
    t.tokens.assign(ep.tokens.begin(), ep.tokens.end());
    t.loss_mask = std::move(ep.loss_mask);
    t.logprobs = std::move(ep.logprobs);
    t.versions = bus::TokenVersions(gr.versions[k]);
    t.prompt_len = ep.prompt_len;
    if (routing_width(gr) > 0) t.routing = {gr.routing_layers, gr.routing_top_k, std::move(gr.routing[k])};
    t.reward = static_cast<float>(ep.reward);
    t.finish = k < gr.truncated.size() && gr.truncated[k] ? "length" : ep.done ? "stop" : "turns";
    const auto meta = trajectory_metadata(ep, k < gr.reward_parts.size() ? &gr.reward_parts[k] : nullptr);
    if (!meta.empty()) t.metadata = meta.dump(-1, ' ', false, json::error_handler_t::replace);
    group.samples.push_back(std::move(t));
  }
  return group;
}

Worker::Worker(WorkerOptions options, Engine& engine, EnvSource envs, bus::Client& client, dist::WeightSubscriber& weights)
    : o_(std::move(options)),
      engine_(engine),
      envs_(std::move(envs)),
      client_(client),
      weights_(weights),
      episodes_(o_.episode_dir, o_.episode_dir.empty() ? 0 : o_.episode_checkpoint_turns) {
  RLX_CHECK(envs_.make, "rollout worker {}: no environment source", o_.who);
  RLX_CHECK(o_.leases_per_request >= 1, "rollout worker {}: leases_per_request must be at least 1", o_.who);
}

namespace {
// Partial rollouts: while a grant rolls out (the worker's thread inside engine.generate), a
// thread of its own stages each new version into the engine, which applies it at its next
// step under its update policy (continue: the samples in flight go on under it). The
// subscriber is polled only here while it runs, never from two threads at once.
class UpdatesDuringRollout {
 public:
  UpdatesDuringRollout(Engine& engine, dist::WeightSubscriber& weights, bool on) {
    if (!on) return;
    thread_ = std::jthread([this, &engine, &weights](const std::stop_token& stop) {
      try {
        while (!stop.stop_requested()) {
          if (auto u = weights.poll()) engine.update_weights(u->version, u->tensors);
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }
  UpdatesDuringRollout(const UpdatesDuringRollout&) = delete;
  UpdatesDuringRollout& operator=(const UpdatesDuringRollout&) = delete;
  ~UpdatesDuringRollout() { stop(); }
  // Stops the thread; rethrows what failed in it (a bad update ends the worker, as between grants).
  void finish() {
    stop();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void stop() {
    if (!thread_.joinable()) return;
    thread_.request_stop();
    thread_.join();
  }
  std::jthread thread_;
  std::exception_ptr error_;
};
}  // namespace

void Worker::say(const std::string& what) const {
  if (o_.status) o_.status(what);
}

void Worker::apply_weights() {
  auto u = weights_.poll();
  if (!u) return;
  // Between grants the engine is idle: one copy into its weights; otherwise staged and
  // applied before its next step.
  if (engine_.has_work()) engine_.update_weights(u->version, u->tensors);
  else engine_.load_weights(u->version, u->tensors);
}

int64_t Worker::run(const std::atomic<bool>& end, const std::atomic<bool>& leave) {
  int64_t wait_us = TraceWriter::now_us();  // since the last grant was done
  int idle_ms = 1;                          // the pause before asking again after an empty grant
  while (!leave && !end) {
    apply_weights();
    bus::LeaseGrant grant;
    say("asking the hub for leases");
    try {
      grant = client_.request_leases(o_.leases_per_request);
    } catch (const Error&) {
      if (end) break;  // stopped while waiting for the hub's answer
      throw;
    }
    if (grant.exhausted) break;
    if (grant.leases.empty()) {
      say(fmt::format("no lease to take (has weights v{}; the hub waits for the learner's next version, or its leases "
                      "are all out)",
                      weights_.version()));
      // Asked again after a pause that grows from 1 ms to 20 ms, cut short by new weights:
      // in synchronous mode the hub grants the next round once the learner's version is out.
      const int64_t had = weights_.version();
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(idle_ms);
      while (std::chrono::steady_clock::now() < until && weights_.version() == had && !end && !leave) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        apply_weights();
      }
      idle_ms = weights_.version() != had ? 1 : std::min(2 * idle_ms, 20);
      if (o_.after_round) o_.after_round();
      continue;
    }
    idle_ms = 1;
    // A lease asks for weights at least as new as its min_version (synchronous mode: the
    // current one); the learner has published them by the time the hub knows them.
    int64_t need = 0;
    for (const auto& l : grant.leases) need = std::max(need, l.min_version);
    const double deadline = now_s() + o_.weights_timeout_s;
    if (weights_.version() < need) say(fmt::format("waiting for weights v{} (has v{})", need, weights_.version()));
    while (weights_.version() < need && !end && !leave) {
      RLX_CHECK(now_s() < deadline, "{}: weights version {} did not arrive within {} s (have {})", o_.who, need,
                o_.weights_timeout_s, weights_.version());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      apply_weights();
    }
    if (end) break;  // the leases held are re-issued if the run goes on
    trace_span("wait_leases", wait_us);
    const double busy_from = now_s();
    const int64_t rollout_us = TraceWriter::now_us();
    say(fmt::format("rolling out {} leases", grant.leases.size()));
    std::function<void()> after_checkpoint;
    if (o_.after_episode_checkpoint) after_checkpoint = [this] { o_.after_episode_checkpoint(episodes_.saved()); };
    DeviceTurns::Turn turn;
    if (o_.turns) {
      say(fmt::format("waiting for the device (the learner trains) to roll out {} leases", grant.leases.size()));
      turn = o_.turns->hold(DeviceTurns::Use::generate, &end);
      if (!turn) break;  // stopped: the hub re-issues these leases if the run goes on
      say(fmt::format("rolling out {} leases", grant.leases.size()));
    }
    UpdatesDuringRollout updates(engine_, weights_, engine_.config().update_policy == UpdatePolicy::continue_);
    auto groups = rollout_groups(engine_, envs_, grant.leases, o_.rollout, &episodes_, after_checkpoint, &end);
    updates.finish();
    if (!end) score_episodes(groups, o_);  // on the device turn: a reward model runs there too
    turn.release();
    if (end) break;  // cut short: the hub re-issues these leases if the run goes on
    const int64_t submit_us = TraceWriter::now_us();
    for (auto& gr : groups) {
      if (!gr.error.empty()) {
        if (gr.error_kind == "data") episodes_.remove(gr.lease);  // infra: the retry continues from it
        log::warn("{}: lease {} (prompt {}): {} error: {}", o_.who, gr.lease.lease_id, gr.lease.prompt_index,
                  gr.error_kind, gr.error);
        client_.report_error(gr.lease.lease_id, gr.error_kind, gr.error);
        continue;
      }
      try {
        client_.submit(to_trajectory_group(gr, o_.who));
      } catch (const Error&) {
        if (end) break;  // stopped while out of credit: the hub re-issues this lease if the run goes on
        throw;
      }
      episodes_.remove(gr.lease);
      ++groups_sent_;
    }
    trace_span("submit", submit_us);
    {  // The episodes' state on their env servers freed together (one round trip, not one each).
      RLX_TRACE_SCOPE("close_envs");
      std::vector<env::Env*> used;
      for (auto& gr : groups)
        for (auto& e : gr.envs) used.push_back(e.get());
      env::close_all(used);
      groups.clear();
    }
    trace_span("rollout", rollout_us);
    wait_us = TraceWriter::now_us();
    busy_s_ += now_s() - busy_from;
    if (o_.after_round) o_.after_round();
  }
  return groups_sent_;
}

}  // namespace rlx::rl
