// `rlx sft`: supervised fine-tuning on an environment's reference completions, with the
// held-out accuracy before and after.
#include "rlx/launch/roles.hpp"

#include "role_common.hpp"

#include <fstream>
#include <iostream>

#include "rlx/algo/algorithm.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/launch/hooks.hpp"
#include "rlx/learner/algorithm_loss.hpp"
#include "rlx/learner/checkpoint.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

TaskExample task_example(const RunConfig& cfg, const Tokenizer& tok, uint64_t seed, uint64_t index, const char* who) {
  const auto options = cfg.env.options_json();
  const auto task = env::Registry::global().generate(cfg.env.name, seed, index, options);
  auto env = env::Registry::global().make(cfg.env.name, {.tokenizer = &tok, .options = options, .seed = cfg.run.seed});
  TaskExample out;
  out.prompt = env->reset(task);
  if (task.contains("completion")) out.completion = task["completion"].get<std::string>();
  else if (task.contains("answer")) out.completion = (task["answer"].is_string() ? task["answer"].get<std::string>() : task["answer"].dump()) + "\n";
  else throw Error(fmt::format("{}: the {} task has neither \"completion\" nor \"answer\"", who, cfg.env.name));
  return out;
}

int run_sft(const RunConfig& cfg) {
  set_threads(cfg);
  env::register_bundled();
  algo::register_bundled_algorithms();
  const auto run_dir = RunDir::of(cfg);
  fs::create_directories(run_dir.root());
  auto tok = run_tokenizer(cfg);
  auto model = initial_model(cfg, *tok);
  const double before = greedy_accuracy(cfg, model, tok);
  std::cerr << fmt::format("sft: held-out accuracy before {:.3f} ({} tasks)", before, cfg.sft.eval_tasks) << std::endl;
  auto comm = dist::single_process();
  auto ao = cfg.algorithm;
  ao.name = "sft";
  auto sft = algo::make_algorithm(ao);
  auto lo = learner_options(cfg.learner, cfg.run.seed, at::Device(cfg.model.device));
  lo.optimizer.lr = cfg.sft.lr;
  lo.fsdp.lora = cfg.model.lora;
  Learner learner(model->config(), *comm, lo);
  learner.load_from(*model);
  std::ofstream metrics_out(run_dir.metrics(), std::ios::trunc);
  for (int64_t step = 0; step < cfg.sft.steps; ++step) {
    std::vector<Sequence> seqs;
    for (uint32_t b = 0; b < cfg.sft.batch; ++b) {
      const auto [prompt, completion] =
          task_example(cfg, *tok, cfg.run.seed, static_cast<uint64_t>(step) * cfg.sft.batch + b, "sft");
      const auto target = tok->encode(completion);
      Sequence s;
      s.tokens.assign(prompt.begin(), prompt.end());
      s.tokens.insert(s.tokens.end(), target.begin(), target.end());
      s.loss_mask.assign(prompt.size(), 0);
      s.loss_mask.insert(s.loss_mask.end(), target.size(), 1);
      seqs.push_back(std::move(s));
    }
    const std::vector<double> rewards(seqs.size(), 0.0);
    const std::vector<size_t> sizes(seqs.size(), 1);
    auto m = train_on_batch(*sft, {.policy = learner}, seqs, rewards, sizes);
    json line = {{"step", step + 1}};
    for (const auto& [k, v] : m) line[k] = v;
    for (const auto& h : hooks())
      if (h.on_step) h.on_step(step, line);
    metrics_out << line.dump() << std::endl;
    if ((step + 1) % 25 == 0 || step + 1 == cfg.sft.steps)
      std::cerr << fmt::format("sft step {}/{}  nll/token {:.3f}", step + 1, cfg.sft.steps,
                               m["nll"] / std::max(1.0, m["tokens"]))
                << std::endl;
  }
  export_hf(learner, run_dir.final_model());
  if (cfg.model.lora.enabled()) export_peft_adapter(learner, run_dir.final_adapter(), cfg.model.path);
  write_tokenizer(cfg, run_dir.final_tokenizer());
  auto tuned = cfg;
  tuned.model.path = run_dir.final_model().string();
  const double after = evaluate(tuned);
  std::cerr << fmt::format("sft: held-out accuracy after {:.3f}; model in {}", after, run_dir.final_model().string()) << std::endl;
  std::cout << json{{"accuracy_before", before}, {"accuracy_after", after}, {"model", run_dir.final_model().string()}}.dump()
            << std::endl;
  return 0;
}

}  // namespace rlx::launch
