// rlx sandbox run [limits] -- CMD ...   one command in the sandbox; its output, then a verdict line
// rlx sandbox check                     the isolation layers this machine grants
// rlx env serve --address A --tokenizer T  an environment server (all registered environments)
// rlx env list                          registered environments
// rlx env score math --input FILE       a {"reward", "extracted"} line per {"response", "answer"} line
// rlx env score python_code --input FILE  a {"reward", "passed", "verdicts"} line per task line with a "response"
// rlx bench env                         sandbox overhead per execution; environment steps/s
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <sstream>

#include "commands.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/json.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/math_answer.hpp"
#include "rlx/env/options.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/env/server.hpp"
#include "rlx/core/log.hpp"

namespace rlx::cli {

namespace {

// The same command without a sandbox: posix_spawn and wait.
double run_bare(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const double t0 = now_s();
  pid_t pid = 0;
  RLX_CHECK(::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) == 0, "bench env: cannot spawn {}", argv[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  RLX_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench env: {} failed bare", argv[0]);
  return now_s() - t0;
}

void add_bench_env(CLI::App& app, Action& action) {
  struct Args {
    int runs = 30, steps = 2000;
  };
  auto a = std::make_shared<Args>();
  auto* c = app.get_subcommand("bench")->add_subcommand("env", "Sandbox overhead per execution (python3 -c pass, bare vs sandboxed) and env steps/s");
  c->add_option("--runs", a->runs, "executions per side (medians reported)")->capture_default_str();
  c->add_option("--steps", a->steps, "arithmetic episodes (reset + step)")->capture_default_str();
  c->callback([a, &action] {
    action = [a] {
      const std::vector<std::string> argv = {"/usr/bin/python3", "-c", "pass"};
      env::Sandbox sandbox;
      std::vector<double> bare, boxed, boxed_true;
      (void)run_bare(argv);  // warm the page cache
      (void)sandbox.run({.argv = argv});
      for (int i = 0; i < a->runs; ++i) {
        bare.push_back(run_bare(argv));
        const auto r = sandbox.run({.argv = argv});
        RLX_CHECK(r.ok(), "bench env: sandboxed python failed: {} {}", config::enum_to_string(r.verdict), r.detail);
        boxed.push_back(r.wall_s);
        boxed_true.push_back(sandbox.run({.argv = {"/bin/true"}}).wall_s);
      }
      const double t0 = now_s();
      for (int i = 0; i < a->runs; ++i) (void)sandbox.run({.argv = argv});
      const double per_exec = (now_s() - t0) / a->runs;
      // Environment steps: arithmetic, char tokenizer, the right answer every time.
      const CharTokenizer tok(default_char_alphabet());
      env::Registry reg;
      env::register_bundled(reg);
      auto e = reg.make("arithmetic", {.tokenizer = &tok});
      std::vector<nlohmann::json> tasks;
      for (int i = 0; i < a->steps; ++i) tasks.push_back(reg.generate("arithmetic", 0, static_cast<uint64_t>(i)));
      const double t1 = now_s();
      double reward = 0;
      for (const auto& t : tasks) {
        e->reset(t);
        reward += e->step(tok.encode(std::to_string(t["answer"].get<long long>()))).reward;
      }
      const double env_s = now_s() - t1;
      RLX_CHECK(reward == a->steps, "bench env: arithmetic scored {} of {}", reward, a->steps);
      const nlohmann::json j = {{"bench", "env"},
                                {"python_bare_ms", 1e3 * median(bare)},
                                {"python_sandboxed_ms", 1e3 * median(boxed)},
                                {"overhead_ms", 1e3 * (median(boxed) - median(bare))},
                                {"true_sandboxed_ms", 1e3 * median(boxed_true)},
                                {"sandboxed_execs_per_s", 1.0 / per_exec},
                                {"arithmetic_steps_per_s", a->steps / env_s},
                                {"runs", a->runs},
                                {"isolation", sandbox.layers()}};
      std::cout << j.dump() << std::endl;
      return 0;
    };
  });
}

// `env list`, in the `env` group of the trainer commands (which holds `env serve`).
void add_env_list(CLI::App& app, Action& action) {
  auto* envc = app.get_subcommand("env");
  auto* list = envc->add_subcommand("list", "The registered environments");
  list->callback([&action] {
    action = [] {
      env::register_bundled();
      for (const auto& [name, description] : env::Registry::global().list()) std::cout << name << "\t" << description << "\n";
      return 0;
    };
  });
}

// One scored line of `env score math`, or the reason the line is bad.
nlohmann::json score_line(const std::string& line, const std::string& where, const env::math::ScoreOptions& options) {
  const auto j = parse_json(line, where);
  RLX_CHECK(j.is_object(), "{}: expected a JSON object with \"response\" and \"answer\"", where);
  RLX_CHECK(j.contains("response") && j["response"].is_string(), "{}: no text \"response\"", where);
  RLX_CHECK(j.contains("answer") && (j["answer"].is_string() || j["answer"].is_number()),
            "{}: no \"answer\" (text or a number)", where);
  const auto& a = j["answer"];
  const auto reference = env::math::reference_answer(a.is_string() ? a.get<std::string>() : a.dump());
  const auto s = env::math::score_response(j["response"].get<std::string>(), reference, options);
  nlohmann::json out = {{"reward", s.reward},
                        {"extracted", s.extracted ? nlohmann::json(s.extracted->text) : nlohmann::json(nullptr)},
                        {"outcome", std::string(config::enum_to_string(s.outcome))}};
  if (!s.detail.empty()) out["detail"] = s.detail;
  return out;
}

// One scored line of `env score python_code`: the task's line with a "response", judged by
// the environment itself (its sandbox runs the response's last ```python block).
nlohmann::json score_code_line(const std::string& line, const std::string& where, const env::Sandbox& sandbox,
                               const nlohmann::json& options) {
  auto j = parse_json(line, where);
  RLX_CHECK(j.is_object(), "{}: expected a JSON object: a python_code task with a \"response\"", where);
  RLX_CHECK(j.contains("response") && j["response"].is_string(), "{}: no text \"response\"", where);
  const std::string response = j["response"].get<std::string>();
  j.erase("response");
  // A tokenizer of exactly the characters used, so that the text reaches the environment unchanged.
  const std::string prompt = j.contains("prompt") && j["prompt"].is_string()       ? j["prompt"].get<std::string>()
                             : j.contains("question") && j["question"].is_string() ? j["question"].get<std::string>()
                                                                                   : std::string();
  RLX_CHECK(text::is_valid_utf8(prompt) && text::is_valid_utf8(response), "{}: the prompt or response is not UTF-8", where);
  std::string alphabet;
  std::set<std::string> seen;
  for (const std::string* t : {&prompt, &response})
    for (size_t i = 0; i < t->size();) {
      const size_t n = text::utf8_sequence_length(*t, i);
      if (seen.insert(t->substr(i, n)).second) alphabet += t->substr(i, n);
      i += n;
    }
  const CharTokenizer tok(alphabet);
  auto e = env::Registry::global().make("python_code", {.tokenizer = &tok, .sandbox = &sandbox, .options = options});
  try {
    e->reset(j);
  } catch (const env::InfraError&) {
    throw;
  } catch (const Error& err) {
    throw Error(fmt::format("{}: {}", where, err.what()));
  }
  const auto r = e->step(tok.encode(response));
  nlohmann::json out = r.info;
  out["reward"] = r.reward;
  return out;
}

// `env score ENV --input FILE.jsonl [--option KEY=VALUE ...]`: the checker on the user's own
// answers. A bad line is named (file:line) on stderr and the exit status is 1 at the end.
void add_env_score(CLI::App& app, Action& action) {
  struct Args {
    std::string env, input;
    std::vector<std::string> options;
    bool warn_missing = false;
  };
  auto a = std::make_shared<Args>();
  auto* c = app.get_subcommand("env")->add_subcommand(
      "score", "Score JSONL lines with an environment's checker: math {\"response\", \"answer\"} -> {\"reward\", \"extracted\"}; "
               "python_code (a task line with a \"response\") -> {\"reward\", \"passed\", \"verdicts\"}");
  c->add_option("env", a->env, "the environment (math, python_code)")->required();
  c->add_option("--input", a->input,
                "JSONL file, one {\"response\": ..., \"answer\": ...} (math) or task with a \"response\" (python_code) per line")
      ->required();
  c->add_option("--option", a->options,
                "an env.options KEY=VALUE (math: extract, format_reward, rel_tol, time_limit_s; "
                "python_code: reward, time_limit_s, memory_mb, max_cases, time_budget_s, float_tol, ...)");
  c->add_flag("--warn-missing", a->warn_missing, "python_code: run where the kernel refuses a sandbox layer (warn, not fail)");
  c->callback([a, &action] {
    action = [a] {
      RLX_CHECK(a->env == "math" || a->env == "python_code",
                "env score: '{}' has no text checker (environments with one: math, python_code)", a->env);
      env::EnvOptions eo;
      for (const auto& kv : a->options) {
        const auto eq = kv.find('=');
        RLX_CHECK(eq != std::string::npos && eq > 0, "env score: --option '{}' is not KEY=VALUE", kv);
        eo.options[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      std::function<nlohmann::json(const std::string&, const std::string&)> score;
      std::unique_ptr<env::Sandbox> sandbox;
      if (a->env == "math") {
        score = [options = env::math::ScoreOptions::from_json(eo.options_json())](const std::string& line,
                                                                                 const std::string& where) {
          return score_line(line, where, options);
        };
      } else {
        env::register_bundled();
        env::SandboxOptions so;
        if (a->warn_missing) so.missing_layer = env::MissingLayer::warn;
        sandbox = std::make_unique<env::Sandbox>(so);
        score = [&sb = *sandbox, options = eo.options_json()](const std::string& line, const std::string& where) {
          return score_code_line(line, where, sb, options);
        };
      }
      std::ifstream in(a->input, std::ios::binary);
      RLX_CHECK(in.good(), "env score: cannot read {}", a->input);
      size_t lineno = 0, bad = 0;
      for (std::string line; std::getline(in, line);) {
        ++lineno;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const auto where = fmt::format("{}:{}", a->input, lineno);
        try {
          auto out = score(line, where);
          out["line"] = lineno;
          std::cout << out.dump() << "\n";
        } catch (const env::InfraError&) {
          throw;
        } catch (const Error& e) {
          ++bad;
          std::cerr << e.what() << "\n";
        }
      }
      std::cout.flush();
      if (bad > 0) std::cerr << fmt::format("env score: {} bad line(s) in {}\n", bad, a->input);
      return bad > 0 ? kExitFailure : 0;
    };
  });
}

}  // namespace

void add_env_commands(CLI::App& app, Action& action) {
  // `sandbox run` comes with the trainer commands (env servers run in it); `check` joins it.
  auto* sb = app.get_subcommand("sandbox");
  auto* check = sb->add_subcommand("check", "Print the isolation layers this machine grants (JSON)");
  auto warn = std::make_shared<bool>(false);
  check->add_flag("--warn-missing", *warn, "report instead of failing where namespaces are refused");
  check->callback([warn, &action] {
    action = [warn] {
      env::SandboxOptions o;
      if (*warn) o.missing_layer = env::MissingLayer::warn;
      env::Sandbox sandbox(o);
      const auto r = sandbox.run({.argv = {"true"}});
      std::cout << nlohmann::json{{"layers", sandbox.layers()},
                                  {"trial_run", std::string(config::enum_to_string(r.verdict))},
                                  {"trial_detail", r.detail}}
                       .dump()
                << std::endl;
      return r.ok() ? 0 : kExitFailure;
    };
  });
  add_bench_env(app, action);
  add_env_list(app, action);
  add_env_score(app, action);
}

}  // namespace rlx::cli
