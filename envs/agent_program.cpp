// agent_program: the episode is an agent program (any language, any OpenAI SDK) run in the
// sandbox, whose only way out is its gateway: an OpenAI chat-completions endpoint on a unix
// socket bound into the sandbox (rlx/serve/gateway.hpp; the program gets its path in
// RLX_GATEWAY_SOCKET). Each call the program makes is one turn: the messages are rendered
// with the model's chat template (the first call's as the prompt; later calls' new messages
// appended after the sampled tokens: chat::TurnDelta), the policy samples, the answer goes
// back as an assistant message (Hermes <tool_call> blocks as tool_calls). The worker records
// every completion's token ids, log-probs and weight versions as the trajectory's turns.
// The reward: {"reward": r} on the program's last stdout line, else 1 when its {"answer": a}
// equals the task's "answer", else 0.
//
// Options: command (argv, required), chat_template_dir (tokenizer_config.json or
// chat_template.jinja, required), readonly_paths (more host paths the program sees, e.g.
// its script and node_modules), env (NAME=VALUE entries for the program, e.g. NODE_PATH),
// call_timeout_s (a program silent this long is stopped; default 60). The task goes to the program's stdin as JSON.
//
// save_state() records the answers given; load_state() starts the program again and answers
// its calls from the record (a deterministic program reaches the same point), so a
// checkpointed episode continues in another process.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common.hpp"
#include "rlx/chat/chat_template.hpp"
#include "rlx/chat/tool_calls.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/serve/gateway.hpp"

namespace rlx::envs {
namespace {

using ojson = nlohmann::ordered_json;

// Messages the program sent back are compared with what rlx recorded by what the template
// renders: role, text content and the calls' names and arguments.
bool same_message(const ojson& a, const ojson& b) {
  auto text = [](const ojson& m) {
    auto it = m.find("content");
    return it == m.end() || it->is_null() ? ojson("") : *it;
  };
  auto calls = [](const ojson& m) {
    ojson out = ojson::array();
    if (auto it = m.find("tool_calls"); it != m.end() && it->is_array())
      for (const auto& c : *it) {
        const ojson& f = c.value("function", ojson::object());
        out.push_back({f.value("name", ojson()), f.value("arguments", ojson())});
      }
    return out;
  };
  return a.value("role", "") == b.value("role", "") && text(a) == text(b) && calls(a) == calls(b);
}

// The sampled text as the program gets it: valid UTF-8, a byte that is not replaced by
// U+FFFD (a sample may end inside a character). The tokens stay as sampled.
std::string valid_utf8(const std::string& s) {
  return nlohmann::json::parse(nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)).get<std::string>();
}

class AgentProgram final : public TextEnv {
 public:
  explicit AgentProgram(const env::Context& c) : TextEnv(c) {
    RLX_CHECK(c.sandbox, "agent_program: needs a sandbox (Context::sandbox)");
    command_ = option<std::vector<std::string>>("command", {});
    RLX_CHECK(!command_.empty(), "agent_program: option 'command' (the program's argv) is required");
    // Relative paths are the run's (the sandbox sees host paths as they are).
    for (auto& arg : command_)
      if (arg.find('/') != std::string::npos && std::filesystem::exists(arg)) arg = std::filesystem::absolute(arg).string();
    auto dir = option<std::string>("chat_template_dir", "");
    RLX_CHECK(!dir.empty(), "agent_program: option 'chat_template_dir' (a tokenizer directory with the chat template) is required");
    template_.emplace(chat::ChatTemplate::load(dir));
    RLX_CHECK(template_->special_tokens().contains("eos_token"), "agent_program: {}: the tokenizer config names no eos_token", dir);
    eos_ = template_->special_tokens()["eos_token"].get<std::string>();
    call_timeout_s_ = option<double>("call_timeout_s", 60.0);
    env_ = option<std::vector<std::string>>("env", {});
    for (const auto& e : env_) RLX_CHECK(e.find('=') != std::string::npos && e.front() != '=', "agent_program: option 'env': '{}' is not NAME=VALUE", e);
    RLX_CHECK(call_timeout_s_ > 0 && call_timeout_s_ <= 86400, "agent_program: call_timeout_s must be in (0, 86400]");
    sandbox_options_ = c.sandbox->options();
    for (const auto& p : option<std::vector<std::string>>("readonly_paths", {}))
      sandbox_options_.readonly_paths.push_back(std::filesystem::absolute(p).string());
  }

  ~AgentProgram() override {
    stop_program();
    gateway_.reset();
    std::error_code ec;
    if (!socket_dir_.empty()) rlx::remove_tree(socket_dir_, ec);
  }

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    begin(task);
    return prompt_tokens(first_call());
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "agent_program: step() after the episode ended");
    const std::string with_special = ctx_.tokenizer->decode(action);
    const std::string sampled_end = with_special.ends_with(eos_) ? eos_ : "";
    ojson message = chat::parse_assistant(valid_utf8(decode(action)), fmt::format("call_{}_", replies_.size()));
    answer(message, sampled_end.empty() ? "length" : message.contains("tool_calls") ? "tool_calls" : "stop",
           static_cast<int64_t>(action.size()));
    replies_.push_back({{"message", message}, {"sampled_end", sampled_end}});
    context_tokens_ += static_cast<int64_t>(action.size());
    auto call = next_call();
    if (!call) return finish();
    const ojson& msgs = (*call)["messages"];
    const size_t known = messages_.size();
    RLX_CHECK(msgs.size() > known + 1, "agent_program: the program's call {} adds no message after the model's answer",
              replies_.size() + 1);
    for (size_t i = 0; i < known; ++i)
      RLX_CHECK(same_message(msgs[i], messages_[i]),
                "agent_program: the program's call {} changed messages[{}]: a conversation only grows (its tokens are the sampled ones)",
                replies_.size() + 1, i);
    RLX_CHECK(same_message(msgs[known], message),
              "agent_program: the program's call {} does not carry the model's answer as messages[{}]", replies_.size() + 1, known);
    ojson added(msgs.begin() + static_cast<long>(known) + 1, msgs.end());
    messages_ = msgs;
    chat::RenderOptions o;
    o.tools = tools_;
    auto observation = encode_chat(chat::TurnDelta::after_assistant(*template_, added, sampled_end, o));
    context_tokens_ += static_cast<int64_t>(observation.size());
    return {.observation = std::move(observation)};
  }

  std::string save_state() const override {
    nlohmann::json s = {{"task", task_}, {"done", done_}, {"reward", reward_}};
    s["replies"] = nlohmann::json::parse(ojson(replies_).dump());
    s["messages"] = nlohmann::json::parse(messages_.dump());
    return s.dump();
  }

  void load_state(std::string_view state) override {
    auto s = parse_state(state, "agent_program");
    begin(s.at("task"));
    done_ = s.value("done", false);
    reward_ = s.value("reward", 0.0);
    if (done_) {
      stop_program();
      return;
    }
    auto recorded = ojson::parse(s.at("replies").dump());
    // The program runs again; its calls are answered from the record up to where the
    // episode was saved.
    prompt_tokens(first_call());
    for (size_t k = 0; k < recorded.size(); ++k) {
      answer(recorded[k]["message"], "stop", 0);
      replies_.push_back(recorded[k]);
      auto call = next_call();
      RLX_CHECK(call, "agent_program: replaying a saved episode, the program ended after {} of {} answers", k + 1, recorded.size());
      messages_ = (*call)["messages"];
    }
    auto saved = ojson::parse(s.at("messages").dump());
    RLX_CHECK(saved.size() == messages_.size(), "agent_program: replaying a saved episode, the program's conversation differs (a program must "
                                                "act the same given the same answers)");
    for (size_t i = 0; i < saved.size(); ++i)
      RLX_CHECK(same_message(saved[i], messages_[i]), "agent_program: replaying a saved episode, messages[{}] differs", i);
  }

  std::vector<std::string> stop_strings() const override { return {eos_}; }

 private:
  std::vector<TokenId> encode_chat(const std::string& text) const {
    return ctx_.tokenizer->encode(text, {.add_special_tokens = false, .parse_special = true});
  }

  // The socket directory, sandbox and gateway, at the first episode: an instance made only to
  // ask for stop_strings() (the worker does) starts none of them.
  void open_gateway() {
    if (gateway_) return;
    char dir_template[] = "/tmp/rlx-agent-XXXXXX";
    RLX_CHECK(::mkdtemp(dir_template), "agent_program: mkdtemp: {}", std::strerror(errno));
    socket_dir_ = dir_template;
    std::filesystem::permissions(socket_dir_, std::filesystem::perms::owner_all | std::filesystem::perms::group_exec |
                                                  std::filesystem::perms::others_exec);
    env::SandboxOptions so = sandbox_options_;
    so.writable_paths.push_back(socket_dir_.string());
    sandbox_ = std::make_unique<env::Sandbox>(so);
    gateway_ = std::make_unique<serve::Gateway>(socket_dir_ / "gateway.sock");
  }

  void begin(const nlohmann::json& task) {
    open_gateway();
    stop_program();
    gateway_->reset();
    task_ = task;
    replies_.clear();
    messages_ = ojson::array();
    tools_ = nullptr;
    done_ = false;
    reward_ = 0;
    context_tokens_ = 0;
    start_program();
  }

  void start_program() {
    cancel_ = false;
    exited_ = false;
    env::SandboxRequest req;
    req.argv = command_;
    req.stdin_data = task_.dump();
    req.env = env_;
    req.env.push_back("RLX_GATEWAY_SOCKET=" + (socket_dir_ / "gateway.sock").string());
    req.env.push_back("OPENAI_API_KEY=rlx-gateway");
    req.cancel = &cancel_;
    program_ = std::thread([this, req = std::move(req)] {
      env::SandboxResult r = sandbox_->run(req);
      {
        std::lock_guard lock(result_mu_);
        result_ = std::move(r);
      }
      exited_ = true;
    });
  }

  void stop_program() {
    if (!program_.joinable()) return;
    cancel_ = true;
    gateway_->reset();
    program_.join();
  }

  // The program's next valid chat-completions call, or nullopt once it has exited (or said
  // nothing for call_timeout_s: it is stopped).
  std::optional<ojson> next_call() {
    while (true) {
      auto call = gateway_->next(call_timeout_s_, [this] { return exited_.load(); });
      if (!call) {
        if (!exited_) stop_program();
        return std::nullopt;
      }
      std::string problem;
      if (!call->contains("messages") || !(*call)["messages"].is_array() || (*call)["messages"].empty())
        problem = "'messages' must be a non-empty list";
      else if (call->value("n", 1) != 1)
        problem = "the gateway samples one choice per call ('n' must be 1)";
      else {
        try {
          chat::check_messages((*call)["messages"]);
        } catch (const Error& e) {
          problem = e.what();
        }
      }
      if (problem.empty()) return call;
      gateway_->reply(400, {{"error", {{"message", problem}, {"type", "invalid_request_error"}, {"param", "messages"}, {"code", nullptr}}}});
    }
  }

  ojson first_call() {
    auto call = next_call();
    if (!call) {
      auto r = program_result();
      if (r.verdict == env::SandboxVerdict::setup_error) throw env::InfraError("agent_program: the sandbox failed: " + r.detail);
      throw Error(fmt::format("agent_program: the program ended ({} exit {}) before calling the model; stderr: {}", config::enum_to_string(r.verdict),
                              r.exit_code, r.stderr_text.substr(r.stderr_text.size() > 500 ? r.stderr_text.size() - 500 : 0)));
    }
    messages_ = (*call)["messages"];
    if (call->contains("tools") && !(*call)["tools"].is_null()) tools_ = (*call)["tools"];
    return *call;
  }

  std::vector<TokenId> prompt_tokens(const ojson& call) {
    chat::RenderOptions o;
    o.tools = tools_;
    if (call.contains("chat_template_kwargs") && call["chat_template_kwargs"].is_object()) o.kwargs = call["chat_template_kwargs"];
    auto tokens = encode_chat(template_->render(messages_, o));
    context_tokens_ = static_cast<int64_t>(tokens.size());
    return tokens;
  }

  void answer(const ojson& message, const char* finish, int64_t completion_tokens) {
    ojson body = {{"id", fmt::format("chatcmpl-rlx-{}", replies_.size())},
                  {"object", "chat.completion"},
                  {"created", std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()},
                  {"model", "policy"},
                  {"choices", ojson::array({{{"index", 0}, {"message", message}, {"logprobs", nullptr}, {"finish_reason", finish}}})},
                  {"usage", {{"prompt_tokens", context_tokens_}, {"completion_tokens", completion_tokens},
                             {"total_tokens", context_tokens_ + completion_tokens}}}};
    gateway_->reply(200, body);
  }

  env::SandboxResult program_result() {
    if (program_.joinable()) program_.join();
    std::lock_guard lock(result_mu_);
    return result_;
  }

  env::StepResult finish() {
    done_ = true;
    env::SandboxResult r = program_result();
    if (r.verdict == env::SandboxVerdict::setup_error) throw env::InfraError("agent_program: the sandbox failed: " + r.detail);
    nlohmann::json out;
    for (size_t end = r.stdout_text.size(); end > 0;) {  // the last line that is a JSON object
      size_t start = r.stdout_text.rfind('\n', end - 1);
      start = start == std::string::npos ? 0 : start + 1;
      auto line = nlohmann::json::parse(r.stdout_text.substr(start, end - start), nullptr, false);
      if (line.is_object()) {
        out = line;
        break;
      }
      end = start == 0 ? 0 : start - 1;
    }
    reward_ = 0;
    if (out.contains("reward") && out["reward"].is_number()) reward_ = out["reward"].get<double>();
    else if (task_.contains("answer") && out.contains("answer"))
      reward_ = (out["answer"] == task_["answer"] ||
                 (out["answer"].is_number() && task_["answer"].is_number() && out["answer"].get<double>() == task_["answer"].get<double>()))
                    ? 1.0
                    : 0.0;
    nlohmann::json info = {{"verdict", config::enum_to_string(r.verdict)}, {"exit_code", r.exit_code}, {"calls", replies_.size()}};
    if (!r.ok()) {
      info["stderr"] = r.stderr_text.substr(r.stderr_text.size() > 300 ? r.stderr_text.size() - 300 : 0);
      // Reward 0 for a program that failed, and said where it can be seen.
      log::warn("agent_program: the program ended {} (exit {}) after {} calls: {}", config::enum_to_string(r.verdict), r.exit_code,
                replies_.size(), info["stderr"].get<std::string>());
    }
    return {.reward = reward_, .done = true, .info = info};
  }

  std::vector<std::string> command_, env_;
  std::optional<chat::ChatTemplate> template_;
  std::string eos_;
  double call_timeout_s_ = 60;
  env::SandboxOptions sandbox_options_;
  std::filesystem::path socket_dir_;
  std::unique_ptr<env::Sandbox> sandbox_;
  std::unique_ptr<serve::Gateway> gateway_;

  std::thread program_;
  std::atomic<bool> cancel_{false}, exited_{false};
  std::mutex result_mu_;
  env::SandboxResult result_;

  nlohmann::json task_;
  ojson messages_ = ojson::array(), tools_;
  std::vector<ojson> replies_;
  bool done_ = false;
  double reward_ = 0;
  int64_t context_tokens_ = 0;
};

}  // namespace

void register_agent_program(env::Registry& r) {
  r.add("agent_program",
        "an agent program (any language, any OpenAI SDK) in the sandbox, calling the policy through a gateway; each call is a turn "
        "(options: command, chat_template_dir, readonly_paths, env, call_timeout_s)",
        [](const env::Context& c) { return std::make_unique<AgentProgram>(c); }, {}, {.runs_code = true});
}

}  // namespace rlx::envs
