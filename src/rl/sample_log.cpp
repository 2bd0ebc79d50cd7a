// Samples you can read (rl/sample_log.hpp).
#include "rlx/rl/sample_log.hpp"

#include <fmt/format.h>

#include <algorithm>


namespace rlx::rl {

using nlohmann::json;

namespace {

std::string decode(const Tokenizer& tok, const bus::SampleView& s, size_t from, size_t to) {
  std::vector<TokenId> ids;
  ids.reserve(to - from);
  for (size_t i = from; i < to; ++i) ids.push_back(s.tokens[i]);
  return tok.decode(ids);
}

json readable(const bus::GroupView& g, size_t k, const Tokenizer& tok, int64_t step) {
  const auto& s = g.samples[k];
  const size_t n = s.tokens.size(), prompt = std::min(n, static_cast<size_t>(std::max(0, s.prompt_len)));
  json out = {{"step", step},
              {"prompt_index", g.prompt_index},
              {"epoch", g.epoch},
              {"sample", k},
              {"prompt", decode(tok, s, 0, prompt)},
              {"response", decode(tok, s, prompt, n)},
              {"reward", s.reward},
              {"finish", std::string(s.finish)}};
  std::vector<int64_t> versions;
  s.versions.append_to(versions);
  int64_t lo = -1, hi = -1;
  for (const int64_t v : versions)
    if (v >= 0) lo = lo < 0 ? v : std::min(lo, v), hi = std::max(hi, v);
  out["version"] = hi;
  if (lo != hi) out["version_min"] = lo;
  const auto meta = json::parse(s.metadata, nullptr, /*allow_exceptions=*/false);
  if (meta.is_object() && meta.contains("info") && meta["info"].is_object() && !meta["info"].empty()) {
    if (meta["info"].contains("extracted")) out["extracted"] = meta["info"]["extracted"];
    out["info"] = meta["info"];
  }
  return out;
}

// Text as an indented markdown code block (no fence a response could close).
std::string code_block(const std::string& text) {
  std::string out = "    ";
  for (const char c : text) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

}  // namespace

std::vector<json> readable_samples(const bus::BatchView& batch, const Tokenizer& tok, int64_t step, size_t k) {
  const auto order = prompt_order(batch);  // the step's order
  std::vector<json> out;
  for (size_t round = 0; out.size() < k; ++round) {
    bool any = false;
    for (const size_t g : order) {
      if (round >= batch.groups[g].samples.size() || out.size() >= k) continue;
      out.push_back(readable(batch.groups[g], round, tok, step));
      any = true;
    }
    if (!any) break;
  }
  return out;
}

std::string samples_markdown(int64_t step, const std::vector<json>& samples) {
  std::string md = fmt::format("## step {}\n", step);
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    md += fmt::format("\n### sample {}: prompt {}, reward {}, version {}, finish {}", i + 1, s.value("prompt_index", 0),
                      s.value("reward", 0.0), s.value("version", int64_t{-1}), s.value("finish", std::string()));
    if (s.contains("extracted") && s["extracted"].is_string())
      md += fmt::format(", extracted `{}`", s["extracted"].get<std::string>());
    md += "\n\nprompt:\n\n" + code_block(s.value("prompt", std::string())) + "\n\nresponse:\n\n" +
          code_block(s.value("response", std::string())) + "\n";
  }
  return md;
}

std::string json_line(const json& sample) { return sample.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace rlx::rl
