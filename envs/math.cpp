// math: problems with reference answers from a dataset (GSM8K, MATH, DAPO-Math, ...); one
// turn; reward 1 when the response's final answer equals the reference (rlx/env/math_answer.hpp,
// math_verify.hpp), else 0 (format_reward when the answer was marked but wrong).
//
// Task: a dataset line, e.g. {"question": ..., "answer": "... #### 72"} (GSM8K) or
// {"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}"} (MATH); the prompt a string or
// chat `messages`. Tasks come from hub.dataset, or from env.options.data (the generator:
// line index % lines) when hub.dataset is empty. Options (docs/MATH.md): prompt_key,
// answer_key, system_prompt, instruction, chat_template_dir, chat_template_kwargs, data,
// strict, extract, format_reward, rel_tol, time_limit_s, stop.
// Step info: outcome, extracted, extractor, reference, detail, and the counters
// errors_unextracted and errors_unparsed (0 or 1; a checker that could not decide counts).
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "common.hpp"
#include "rlx/chat/chat_template.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/log.hpp"
#include "rlx/env/math_answer.hpp"

namespace rlx::envs {

namespace {

namespace m = env::math;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const std::vector<std::string> kOptionNames = {
    "prompt_key", "answer_key", "system_prompt", "instruction", "chat_template_dir", "chat_template_kwargs", "data",
    "strict",     "extract",    "format_reward", "rel_tol",     "time_limit_s",      "stop"};
// Where a task's prompt and reference answer are when the options do not say (in this order).
const std::vector<std::string> kPromptKeys = {"prompt", "question", "problem", "messages"};
const std::vector<std::string> kAnswerKeys = {"answer", "solution", "ground_truth", "reference"};

std::string text_option(const json& o, const char* key) {
  if (!o.contains(key)) return {};
  RLX_CHECK(o.at(key).is_string(), "math option '{}': expected text, got {}", key, o.at(key).dump());
  return o.at(key).get<std::string>();
}

struct TaskKeys {
  std::string prompt, answer;  // empty: the first of kPromptKeys / kAnswerKeys the task has
  explicit TaskKeys(const json& o) : prompt(text_option(o, "prompt_key")), answer(text_option(o, "answer_key")) {}
};

std::string find_key(const json& task, const std::string& chosen, const std::vector<std::string>& defaults,
                     const char* what, const char* option, std::string_view where) {
  if (!chosen.empty()) {
    if (task.contains(chosen)) return chosen;
  } else {
    for (const auto& k : defaults)
      if (task.contains(k)) return k;
  }
  std::vector<std::string> keys;
  for (const auto& [k, v] : task.items()) keys.push_back(k);
  throw Error(fmt::format("{}: no {} key {} (env.options.{}); the task has: {}", where, what,
                          chosen.empty() ? fmt::format("among {}", fmt::join(defaults, ", ")) : "'" + chosen + "'",
                          option, fmt::join(keys, ", ")));
}

// A task's prompt (text or messages) and final reference answer; throws rlx::Error naming
// `where` (file:line, or the task) and the missing or mistyped key.
std::pair<json, std::string> read_task(const json& task, const TaskKeys& keys, std::string_view where) {
  RLX_CHECK(task.is_object(), "{}: a task must be a JSON object, got {}", where, task.type_name());
  const auto pk = find_key(task, keys.prompt, kPromptKeys, "prompt", "prompt_key", where);
  const auto ak = find_key(task, keys.answer, kAnswerKeys, "answer", "answer_key", where);
  const json& prompt = task.at(pk);
  RLX_CHECK(prompt.is_string() || (prompt.is_array() && !prompt.empty()),
            "{}: '{}' must be text or a non-empty list of chat messages, got {}", where, pk, prompt.type_name());
  const json& answer = task.at(ak);
  RLX_CHECK(answer.is_string() || answer.is_number(), "{}: '{}' must be text or a number, got {}", where, ak,
            answer.type_name());
  std::string reference = m::reference_answer(answer.is_string() ? answer.get<std::string>() : answer.dump());
  RLX_CHECK(!reference.empty(), "{}: '{}' is empty", where, ak);
  return {prompt, std::move(reference)};
}

// One object per path (a file's tasks, a chat template) for the whole process: environments
// are made per episode, the generator is called per task.
template <class T, class Make>
std::shared_ptr<const T> cached(const std::string& key, Make make) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const T>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[key];
  if (!slot) slot = std::make_shared<const T>(make());
  return slot;
}

std::shared_ptr<const envs::TaskFile> task_file(const std::string& path, const json& o) {
  const TaskKeys keys(o);
  return envs::read_task_file("math", path, envs::strict_option("math", o, false),
                              fmt::format("{}\n{}", keys.prompt, keys.answer),
                              [&](const json& task, const std::string& where) { (void)read_task(task, keys, where); });
}

class Math final : public TextEnv {
 public:
  explicit Math(const env::Context& c) : TextEnv(c), keys_(c.options) {
    score_ = m::ScoreOptions::from_json(c.options);
    system_ = option<std::string>("system_prompt", "");
    instruction_ = option<std::string>("instruction", "");
    stop_ = option<std::vector<std::string>>("stop", {});
    if (const auto dir = option<std::string>("chat_template_dir", ""); !dir.empty()) {
      template_ = cached<chat::ChatTemplate>(dir, [&] { return chat::ChatTemplate::load(dir); });
      render_.kwargs = ojson::parse(option<json>("chat_template_kwargs", json::object()).dump());
      const auto& special = template_->special_tokens();
      if (stop_.empty() && special.contains("eos_token") && special["eos_token"].is_string())
        stop_ = {special["eos_token"].get<std::string>()};
    }
  }

  std::vector<TokenId> reset(const json& task) override {
    auto [prompt, reference] = read_task(task, keys_, "math task");
    reference_ = std::move(reference);
    done_ = false;
    return render(prompt);
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "math: step() after the episode ended");
    done_ = true;
    const m::Score s = m::score_response(decode(action), reference_, score_);
    env::StepResult r;
    r.done = true;
    r.reward = s.reward;
    r.info = {{"outcome", std::string(config::enum_to_string(s.outcome))},
              {"extracted", s.extracted ? json(s.extracted->text) : json(nullptr)},
              {"extractor", s.extracted ? json(std::string(config::enum_to_string(s.extracted->by))) : json(nullptr)},
              {"reference", reference_},
              {"errors_unextracted", s.outcome == m::Outcome::unextracted ? 1 : 0},
              {"errors_unparsed", s.outcome == m::Outcome::unparsed || s.outcome == m::Outcome::limit ? 1 : 0}};
    if (!s.detail.empty()) r.info["detail"] = s.detail;
    return r;
  }

  std::vector<std::string> stop_strings() const override { return stop_; }

  std::string save_state() const override { return json{{"reference", reference_}, {"done", done_}}.dump(); }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "math");
    reference_ = field<std::string>(j, "reference", "math state");
    done_ = field<bool>(j, "done", "math state");
  }

 private:
  // The prompt through the chat template when there is one; else the messages' text.
  std::vector<TokenId> render(const json& prompt) const {
    ojson messages = prompt.is_string() ? ojson::array({{{"role", "user"}, {"content", prompt.get<std::string>()}}})
                                        : ojson::parse(prompt.dump());
    if (!system_.empty() && !(messages[0].is_object() && messages[0].value("role", "") == "system"))
      messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", system_}});
    if (!instruction_.empty()) {
      auto& last = messages.back();
      RLX_CHECK(last.is_object() && last.contains("content") && last["content"].is_string(),
                "math: the instruction is appended to the last message's text, and it has none");
      last["content"] = last["content"].get<std::string>() + " " + instruction_;
    }
    if (template_)
      return ctx_.tokenizer->encode(template_->render(messages, render_), {.add_special_tokens = false, .parse_special = true});
    std::string text;
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& msg = messages[i];
      RLX_CHECK(msg.is_object() && msg.contains("content") && msg["content"].is_string(),
                "math: messages[{}] has no text content (a chat template, env.options.chat_template_dir, renders others)", i);
      text += (i ? "\n\n" : "") + msg["content"].get<std::string>();
    }
    return encode(text);
  }

  TaskKeys keys_;
  m::ScoreOptions score_;
  std::string system_, instruction_;
  std::vector<std::string> stop_;
  std::shared_ptr<const chat::ChatTemplate> template_;
  chat::RenderOptions render_;
  std::string reference_;
  bool done_ = false;
};

// Without env.options.data: a few problems in each format (for `rlx env serve --check math`).
json generate_math_task(uint64_t, uint64_t index, const json& o) {
  check_option_names("math", o, kOptionNames);
  if (const auto path = text_option(o, "data"); !path.empty()) {
    const auto file = task_file(path, o);
    return file->tasks[index % file->tasks.size()];
  }
  static const json builtin = json::parse(R"JSON([
    {"question": "Tom has 3 boxes of 12 pencils and gives away 7 pencils. How many pencils does he have left?",
     "answer": "3 boxes hold 3 * 12 = 36 pencils. 36 - 7 = 29.\n#### 29"},
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?",
     "solution": "The common denominator is 6: $\\frac{3}{6} + \\frac{2}{6} = \\boxed{\\frac{5}{6}}$."},
    {"problem": "Solve $x^2 - 5x + 6 = 0$.", "answer": "2, 3"},
    {"prompt": "A shirt costs $40 and is sold at a 15% discount. What is the price after the discount?", "answer": 34}
  ])JSON");
  return builtin[index % builtin.size()];
}

}  // namespace

void register_math(env::Registry& r) {
  r.add("math",
        "dataset problems with reference answers (GSM8K, MATH); reward 1 for an equivalent final answer "
        "(options: data, prompt_key, answer_key, instruction, chat_template_dir, extract, format_reward)",
        [](const env::Context& c) {
          check_option_names("math", c.options, kOptionNames);
          return std::make_unique<Math>(c);
        },
        generate_math_task);
}

}  // namespace rlx::envs
