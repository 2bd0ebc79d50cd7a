// `rlx rm`: a reward model trained from preference pairs with the Bradley-Terry loss
// -log sigmoid(r(chosen) - r(rejected)), with the held-out pairwise accuracy before and after;
// RUN_DIR/final is an HF sequence classifier (reward_model.hpp) that `reward_model.path` takes.
//
// The score of a sequence is the value head at its last token (learner/preference.hpp).
#include "rlx/launch/roles.hpp"

#include "role_common.hpp"

#include <c10/core/GradMode.h>

#include <cmath>
#include <fstream>
#include <iostream>

#include "rlx/core/files.hpp"
#include "rlx/core/json.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "rlx/learner/learner.hpp"
#include "rlx/learner/preference.hpp"
#include "rlx/model/reward_model.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kHeldOutPairsSeed = 0x726d686f6c64;  // "rmhold": pairs training never draws
constexpr uint64_t kRejectedSeed = 0x726d72656a;   // "rmrej": the tasks whose answers are rejected
constexpr size_t kMaxDataBytes = size_t{1} << 30;

using Pair = PreferencePair;

std::vector<int64_t> joined(const std::vector<TokenId>& prompt, const std::vector<TokenId>& completion) {
  std::vector<int64_t> out(prompt.begin(), prompt.end());
  out.insert(out.end(), completion.begin(), completion.end());
  return out;
}

// The environment's task `index` of stream `seed`: its answer chosen, the first answer of
// another task that differs from it rejected.
Pair env_pair(const RunConfig& cfg, const Tokenizer& tok, uint64_t seed, uint64_t index) {
  const auto a = task_example(cfg, tok, seed, index, "rm");
  for (uint64_t k = 0; k < 64; ++k) {
    const auto b = task_example(cfg, tok, seed ^ kRejectedSeed, index * 64 + k, "rm");
    if (b.completion != a.completion) return {joined(a.prompt, tok.encode(a.completion)), joined(a.prompt, tok.encode(b.completion))};
  }
  throw Error(fmt::format("rm: the {} environment's tasks give the same answer every time; it cannot make preference "
                          "pairs (give rm.data)",
                          cfg.env.name));
}

// rm.data: one {"prompt", "chosen", "rejected"} object per line.
std::vector<Pair> file_pairs(const RunConfig& cfg, const Tokenizer& tok) {
  std::istringstream in(read_file(cfg.rm.data, kMaxDataBytes));
  std::vector<Pair> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = fmt::format("rm.data {} line {}", cfg.rm.data, n);
    const json j = parse_json(line, where);
    for (const char* key : {"prompt", "chosen", "rejected"})
      RLX_CHECK(j.is_object() && j.contains(key) && j[key].is_string(), "{}: no string \"{}\"", where, key);
    const auto prompt = tok.encode(j["prompt"].get<std::string>());
    out.push_back({joined(prompt, tok.encode(j["chosen"].get<std::string>())),
                   joined(prompt, tok.encode(j["rejected"].get<std::string>()))});
    RLX_CHECK(out.back().chosen.size() > prompt.size() && out.back().rejected.size() > prompt.size(),
              "{}: an empty completion", where);
  }
  RLX_CHECK(out.size() > cfg.rm.eval_pairs, "rm.data {}: {} pairs; more than rm.eval_pairs ({}) are needed (the last {} "
            "are held out)", cfg.rm.data, out.size(), cfg.rm.eval_pairs, cfg.rm.eval_pairs);
  return out;
}

// Scores `seqs` (pairs, chosen first) without gradients, and sets their weights.
PreferenceStats score_pairs(Learner& rm, std::vector<Sequence>& seqs) {
  rm.annotate(seqs, "", kPreferenceScore);
  return bradley_terry(seqs);
}

}  // namespace

int run_rm(const RunConfig& cfg) {
  set_threads(cfg);
  env::register_bundled();
  const auto run_dir = RunDir::of(cfg);
  fs::create_directories(run_dir.root());
  auto tok = run_tokenizer(cfg);
  auto start = initial_model(cfg, *tok);
  const int64_t end_token = std::max<int64_t>(start->config().eos_token_id, 0);
  auto comm = dist::single_process();
  auto lo = learner_options(cfg.learner, cfg.run.seed, at::Device(cfg.model.device));
  lo.optimizer.lr = cfg.rm.lr;
  lo.fsdp.lora = cfg.model.lora;
  lo.policy_head = false;  // the value head is the score head
  lo.value_head = true;
  Learner rm(start->config(), *comm, lo);
  rm.load_from(*start);

  std::vector<Pair> data, held_out;
  if (!cfg.rm.data.empty()) {
    data = file_pairs(cfg, *tok);
    held_out.assign(data.end() - cfg.rm.eval_pairs, data.end());
    data.resize(data.size() - cfg.rm.eval_pairs);
  } else {
    for (uint64_t i = 0; i < cfg.rm.eval_pairs; ++i) held_out.push_back(env_pair(cfg, *tok, cfg.run.seed ^ kHeldOutPairsSeed, i));
  }
  auto eval_seqs = preference_sequences(held_out, end_token);
  const auto before = score_pairs(rm, eval_seqs);
  std::cerr << fmt::format("rm: held-out pairwise accuracy before {:.3f} ({} pairs)", before.accuracy, held_out.size())
            << std::endl;

  std::ofstream metrics_out(run_dir.metrics(), std::ios::trunc);
  const int64_t h = start->config().hidden_size;
  for (int64_t step = 0; step < cfg.rm.steps; ++step) {
    std::vector<Pair> batch;
    for (uint32_t b = 0; b < cfg.rm.batch; ++b) {
      const uint64_t i = static_cast<uint64_t>(step) * cfg.rm.batch + b;
      batch.push_back(data.empty() ? env_pair(cfg, *tok, cfg.run.seed, i) : data[i % data.size()]);
    }
    auto seqs = preference_sequences(batch, end_token);
    const auto stats = score_pairs(rm, seqs);
    auto r = rm.step(seqs, bradley_terry_loss());
    {
      // HF's score head has no bias, and Bradley-Terry is blind to one (its gradient sums to
      // rounding noise that Adam would amplify): it stays 0.
      c10::NoGradGuard no_grad;
      rm.value_head()[h].zero_();
    }
    json line = {{"step", step + 1}, {"bt_loss", stats.loss}, {"pair_accuracy", stats.accuracy},
                 {"margin", stats.margin}, {"grad_norm", r.grad_norm}, {"lr", r.lr}};
    for (const auto& hk : hooks())
      if (hk.on_step) hk.on_step(step, line);
    metrics_out << line.dump() << std::endl;
    if ((step + 1) % 25 == 0 || step + 1 == cfg.rm.steps)
      std::cerr << fmt::format("rm step {}/{}  loss {:.3f}  pair accuracy {:.3f}  margin {:.3f}", step + 1,
                               cfg.rm.steps, stats.loss, stats.accuracy, stats.margin)
                << std::endl;
  }
  const auto after = score_pairs(rm, eval_seqs);

  // The body's gathered weights and the head, as an HF sequence classifier.
  const auto final_dir = run_dir.final_model();
  Transformer body(start->config(), at::kFloat, at::kCPU);
  {
    auto params = rm.model().gather_parameters();
    std::map<std::string, at::Tensor> by_name(params.begin(), params.end());
    c10::NoGradGuard no_grad;
    for (auto& [name, p] : body.hf_parameters()) p.copy_(by_name.at(name));
  }
  save_hf_reward_model(body, rm.value_head().detach().narrow(0, 0, h).cpu(), final_dir);
  write_tokenizer(cfg, run_dir.final_tokenizer());
  std::cerr << fmt::format("rm: held-out pairwise accuracy after {:.3f}; reward model in {}", after.accuracy,
                           final_dir.string())
            << std::endl;
  std::cout << json{{"accuracy_before", before.accuracy}, {"accuracy_after", after.accuracy},
                    {"eval_pairs", held_out.size()}, {"model", final_dir.string()}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace rlx::launch
