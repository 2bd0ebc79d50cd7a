// Samples you can read (log.samples_every, log.samples_per_step): K of a step's
// trajectories as text, one JSON object each for RUN_DIR/samples.jsonl, and all of them as
// markdown for TensorBoard's text plugin. Which K: a sample of each group in prompt order,
// then a second of each, ... (several prompts before several answers to one).
//
//   auto picked = rlx::readable_samples(batch, tokenizer, step, 4);
//   for (const auto& s : picked) out << rlx::json_line(s) << "\n";
//   tensorboard.add_text(step, "samples", rlx::samples_markdown(step, picked));
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rlx/bus/message.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx::rl {

// Each: {"step", "prompt_index", "epoch", "sample", "prompt" (the first prompt_len tokens,
// decoded), "response" (the rest: actions and, in multi-turn episodes, observations),
// "reward", "finish", "version" (the newest weight version among its tokens; "version_min"
// too when they differ), "extracted" (when the environment's info has one) and "info" (the
// environment's last-turn text values, when any)}.
std::vector<nlohmann::json> readable_samples(const bus::BatchView& batch, const Tokenizer& tokenizer, int64_t step,
                                             size_t k);
// The samples as one markdown text: a heading per sample, prompt and response as code blocks.
std::string samples_markdown(int64_t step, const std::vector<nlohmann::json>& samples);
// A sample as one JSON line (bytes a tokenizer decoded that are not UTF-8 become U+FFFD).
std::string json_line(const nlohmann::json& sample);

}  // namespace rlx::rl
