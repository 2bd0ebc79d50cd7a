// The OpenAI-compatible server: HTTP (cpp-httplib) around the engine; see rlx/serve/server.hpp.
#include "rlx/serve/server.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "rlx/core/json.hpp"
#include "rlx/core/log.hpp"
#include "serve/http_server.hpp"
#include "serve/port_check.hpp"

namespace rlx::serve {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// How often a handler waiting for the engine looks whether its client is still there.
constexpr auto kClientCheck = std::chrono::milliseconds(50);

detail::ConnectionLimits connection_limits(const ServeLimits& l) {
  detail::ConnectionLimits c;
  c.max_connections = l.max_connections > 0 ? l.max_connections : 2 * l.max_in_flight + 64;
  c.max_connections_per_peer = l.max_connections_per_peer > 0 ? l.max_connections_per_peer : l.max_in_flight + 32;
  c.max_body_bytes = l.max_body_bytes;
  c.request_read_timeout_s = l.request_read_timeout_s;
  return c;
}

}  // namespace

// One request in flight: what the engine thread has produced so far. Outside the anonymous
// namespace because Server::Impl holds it (GCC's -Wsubobject-linkage in unity builds).
namespace detail {
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<TokenId>> tokens;  // per sample, as sampled
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<std::vector<TokenLogprob>>> top;  // per sample, per token: the alternatives asked for
  std::optional<GenerationResult> result;
  std::optional<ApiError> error;
  bool done = false;

  void finish(std::optional<GenerationResult> r, std::optional<ApiError> e) {
    {
      std::lock_guard lock(mu);
      result = std::move(r);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
};
}  // namespace detail
using detail::Pending;

struct Server::Impl {
  Impl(Engine& e, ServedModel m, ServerOptions o)
      : engine(e), model(std::move(m)), options(std::move(o)),
        http(connection_limits(options.limits), [](const httplib::Request&, int status, const std::string& message) {
          return dump(ApiError(status, message).body());
        }) {}

  Engine& engine;
  ServedModel model;
  ServerOptions options;
  detail::BoundedServer http;
  int bound_port = -1;
  std::thread engine_thread, http_thread;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> counter{0};
  uint64_t seed_base = std::random_device{}();
  int64_t max_stop_len_cache = 0;

  std::mutex mu;  // guards the queues and `pending`
  std::condition_variable cv;
  std::deque<GenerationRequest> to_add;
  std::deque<std::string> to_abort;
  std::unordered_map<std::string, std::shared_ptr<Pending>> pending;

  // ---- engine thread
  void engine_loop() {
    while (!stopping) {
      std::deque<GenerationRequest> adds;
      std::deque<std::string> aborts;
      {
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(50),
                    [&] { return stopping || !to_add.empty() || !to_abort.empty() || engine.has_work(); });
        adds.swap(to_add);
        aborts.swap(to_abort);
      }
      for (auto& r : adds) {
        std::string id = r.id;
        try {
          engine.add(std::move(r));
        } catch (const Error& e) {
          deliver_error(id, ApiError(400, e.what()));
        }
      }
      for (const auto& id : aborts) engine.abort(id);
      if (!engine.has_work()) continue;
      std::vector<GenerationResult> done;
      try {
        done = engine.step();
      } catch (const std::exception& e) {
        // A step is one forward over every running request, and the engine's state after a
        // failed one is unknown: the failure cannot be pinned on one request, so all end.
        // Every value a client sends is checked before the engine takes the request
        // (parse_request, Engine::add), so this is a bug or the device failing, not a client.
        log::error("rlx serve: the engine failed a step: {}; ending every request in flight", e.what());
        fail_all(ApiError(500, fmt::format("the engine failed: {}", e.what())));
        continue;
      }
      for (auto& r : done) {
        std::shared_ptr<Pending> p;
        {
          std::lock_guard lock(mu);
          auto it = pending.find(r.id);
          if (it == pending.end()) continue;
          p = it->second;
          pending.erase(it);
        }
        p->finish(std::move(r), std::nullopt);
      }
    }
  }

  void deliver_error(const std::string& id, ApiError e) {
    std::shared_ptr<Pending> p;
    {
      std::lock_guard lock(mu);
      auto it = pending.find(id);
      if (it == pending.end()) return;
      p = it->second;
      pending.erase(it);
    }
    p->finish(std::nullopt, std::move(e));
  }

  void fail_all(const ApiError& e) {
    std::unordered_map<std::string, std::shared_ptr<Pending>> all;
    {
      std::lock_guard lock(mu);
      all.swap(pending);
    }
    for (auto& [id, p] : all) {
      engine.abort(id);
      p->finish(std::nullopt, e);
    }
    if (stopping) return;
    try {
      engine.run();  // drains the aborted requests
    } catch (const std::exception& ex) {
      log::error("rlx serve: the engine failed again while ending the requests: {}", ex.what());
    }
  }

  // ---- HTTP side
  std::shared_ptr<Pending> submit(ParsedRequest& req, const std::string& id) {
    auto p = std::make_shared<Pending>();
    auto n = static_cast<size_t>(req.generation.params.n);
    p->tokens.resize(n);
    p->logprobs.resize(n);
    p->top.resize(n);
    req.generation.id = id;
    req.generation.sampling_key = "rlx-serve";  // equal seeds, equal samples (OpenAI's `seed`)
    if (req.stream) {
      std::weak_ptr<Pending> weak = p;
      req.generation.on_token = [weak](int64_t sample, TokenId token, float logprob, const std::vector<TokenLogprob>& top) {
        auto q = weak.lock();
        if (!q) return;
        {
          std::lock_guard lock(q->mu);
          q->tokens[static_cast<size_t>(sample)].push_back(token);
          q->logprobs[static_cast<size_t>(sample)].push_back(logprob);
          if (!top.empty()) q->top[static_cast<size_t>(sample)].push_back(top);
        }
        q->cv.notify_all();
      };
    }
    {
      std::lock_guard lock(mu);
      if (stopping) throw ApiError(503, "the server is shutting down");
      pending[id] = p;
      to_add.push_back(req.generation);
    }
    cv.notify_all();
    return p;
  }

  void abort(const std::string& id) {
    {
      std::lock_guard lock(mu);
      to_abort.push_back(id);
    }
    cv.notify_all();
  }

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(e.body()), "application/json");
  }

  void handle(const std::string& http_body, httplib::Response& res, Endpoint endpoint) {
    if (in_flight.fetch_add(1) >= options.limits.max_in_flight) {
      in_flight.fetch_sub(1);
      res.set_header("Retry-After", "1");
      return send_error(res, ApiError(429, fmt::format("more than {} requests in flight; retry later", options.limits.max_in_flight)));
    }
    struct Release {  // gives the slot back once, when the request (or its stream) ends
      explicit Release(std::atomic<int64_t>& counter) : n(counter) {}
      Release(const Release&) = delete;
      Release& operator=(const Release&) = delete;
      ~Release() { n.fetch_sub(1); }
      std::atomic<int64_t>& n;
    };
    auto release = std::make_shared<Release>(in_flight);
    try {
      json body;
      try {
        body = parse_json<json>(http_body, "the request body");  // bounded depth: what walks it recursively is safe
      } catch (const JsonError& e) {
        throw ApiError(400, e.what());
      }
      uint64_t n = counter.fetch_add(1);
      ParsedRequest req = parse_request(body, endpoint, model, options.limits, seed_base ^ (n * 0x9E3779B97F4A7C15ull));
      std::string id = fmt::format("{}-{:x}{:06x}", endpoint == Endpoint::chat ? "chatcmpl" : "cmpl", seed_base & 0xffffff, n);
      int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
      auto p = submit(req, id);
      if (!req.stream) {
        auto deadline = Clock::now() + std::chrono::duration<double>(options.limits.request_timeout_s);
        std::unique_lock lock(p->mu);
        while (!p->cv.wait_for(lock, kClientCheck, [&] { return p->done; })) {
          lock.unlock();
          if (Clock::now() >= deadline) {
            abort(id);
            throw ApiError(504, fmt::format("the request took longer than {} s and was aborted", options.limits.request_timeout_s));
          }
          if (!detail::BoundedServer::client_connected()) {
            // Nobody will read the answer: the engine's time goes to the others.
            abort(id);
            detail::BoundedServer::close_after_response();
            throw ApiError(499, "the client closed the connection; the request was aborted");
          }
          lock.lock();
        }
        if (p->error) throw *p->error;
        res.set_content(dump(response(req, *p->result, model, id, created)), "application/json");
        return;
      }
      // The stream's callbacks hold `release`: the slot is given back when the stream ends.
      auto shared_req = std::make_shared<ParsedRequest>(std::move(req));
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, p, shared_req, id, created](size_t, httplib::DataSink& sink) { return stream(*shared_req, p, id, created, sink); },
          [this, release, id, p](bool success) {
            if (!success) abort(id);
          });
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }

  // Writes the whole stream of one request; false when the client went away (the request
  // is then aborted).
  bool stream(const ParsedRequest& req, const std::shared_ptr<Pending>& p, const std::string& id, int64_t created,
              httplib::DataSink& sink) {
    auto write = [&](const json& j) {
      std::string line = "data: " + dump(j) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    const auto n = static_cast<size_t>(req.generation.params.n);
    size_t holdback = 0;
    for (const auto& s : req.generation.params.stop_strings) holdback = std::max(holdback, s.size() - 1);
    std::vector<size_t> sent_tokens(n, 0), sent_bytes(n, 0);
    for (size_t i = 0; i < n; ++i)
      if (!write(chunk_open(req, model, id, created, static_cast<int64_t>(i)))) return abort_stream(id);
    auto deadline = Clock::now() + std::chrono::duration<double>(options.limits.request_timeout_s);
    while (true) {
      std::vector<std::vector<TokenId>> tokens;
      std::vector<std::vector<float>> logprobs;
      std::vector<std::vector<std::vector<TokenLogprob>>> top;
      bool done;
      {
        std::unique_lock lock(p->mu);
        p->cv.wait_for(lock, kClientCheck);
        tokens = p->tokens;
        logprobs = p->logprobs;
        top = p->top;
        done = p->done;
      }
      if (done && p->error) {
        write(p->error->body());
        sink.done();
        return true;
      }
      for (size_t i = 0; i < n; ++i) {
        if (tokens[i].size() == sent_tokens[i] && !done) continue;
        std::string text;
        if (done) {
          text = sample_text(*model.tokenizer, p->result->samples[i]);
        } else {
          SampleOutput partial;
          partial.tokens = tokens[i];
          text = sample_text(*model.tokenizer, partial, /*complete_only=*/true);
          text.erase(text.size() > holdback ? text.size() - holdback : 0);
        }
        const std::vector<TokenId>& final_tokens = done ? p->result->samples[i].tokens : tokens[i];
        const std::vector<float>& final_lps = done ? p->result->samples[i].logprobs : logprobs[i];
        if (text.size() <= sent_bytes[i] && final_tokens.size() == sent_tokens[i]) continue;
        std::vector<TokenId> new_tokens(final_tokens.begin() + static_cast<long>(sent_tokens[i]), final_tokens.end());
        std::vector<float> new_lps(final_lps.begin() + static_cast<long>(sent_tokens[i]), final_lps.end());
        const auto& final_top = done ? p->result->samples[i].top_logprobs : top[i];
        std::vector<std::vector<TokenLogprob>> new_top;
        if (final_top.size() > sent_tokens[i]) new_top.assign(final_top.begin() + static_cast<long>(sent_tokens[i]), final_top.end());
        std::string delta = text.size() > sent_bytes[i] ? text.substr(sent_bytes[i]) : "";
        if (!write(chunk_delta(req, model, id, created, static_cast<int64_t>(i), delta, new_tokens, new_lps, new_top))) return abort_stream(id);
        sent_tokens[i] = final_tokens.size();
        sent_bytes[i] = std::max(sent_bytes[i], text.size());
      }
      if (done) break;
      if (!detail::BoundedServer::client_connected()) return abort_stream(id);  // gone between tokens (a long prefill, a queue)
      if (Clock::now() > deadline) {
        abort(id);
        write(ApiError(504, "the request took too long and was aborted").body());
        sink.done();
        return true;
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (!write(chunk_finish(req, model, id, created, static_cast<int64_t>(i), p->result->samples[i]))) return abort_stream(id);
    if (req.include_usage && !write(chunk_usage(req, model, id, created, *p->result))) return abort_stream(id);
    static const std::string kDone = "data: [DONE]\n\n";
    sink.write(kDone.data(), kDone.size());
    sink.done();
    return true;
  }

  bool abort_stream(const std::string& id) {
    abort(id);
    return false;
  }

  void routes() {
    // Bodies, request times and connections are bounded by `http` (serve/http_server.hpp);
    // each connection has a thread, so a request waiting for the engine holds no one else up.
    http.post("/v1/chat/completions", [this](const httplib::Request&, const std::string& body, httplib::Response& r) {
      handle(body, r, Endpoint::chat);
    });
    http.post("/v1/completions", [this](const httplib::Request&, const std::string& body, httplib::Response& r) {
      handle(body, r, Endpoint::completion);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      json m = {{"id", model.name}, {"object", "model"}, {"created", 0}, {"owned_by", "rlx"}, {"max_model_len", model.max_model_len}};
      r.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(dump({{"status", "ok"}, {"in_flight", in_flight.load()}, {"max_in_flight", options.limits.max_in_flight}}),
                    "application/json");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(r, ApiError(500, what));
    });
  }
};

Server::Server(Engine& engine, ServedModel model, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(model), std::move(options))) {
  RLX_CHECK(impl_->model.tokenizer, "rlx serve needs the model's tokenizer");
  const ServeLimits& l = impl_->options.limits;
  RLX_CHECK(l.max_in_flight >= 1 && l.max_body_bytes >= 1 && l.max_n >= 1 && l.max_connections >= 0 &&
                l.max_connections_per_peer >= 0,
            "rlx serve: max_in_flight, max_body_bytes and max_n must be >= 1 and the connection limits >= 0");
  RLX_CHECK(l.request_timeout_s > 0 && l.request_read_timeout_s > 0, "rlx serve: request_timeout_s is {} and request_read_timeout_s {}; both must be > 0",
            l.request_timeout_s, l.request_read_timeout_s);
}

Server::~Server() { stop(); }

void Server::start() {
  Impl& s = *impl_;
  s.routes();
  if (s.options.port != 0)
    if (auto why = detail::port_unavailable(s.options.host, s.options.port); !why.empty())
      RLX_CHECK(false, "rlx serve: cannot listen on {}:{}: {}", s.options.host, s.options.port, why);
  s.bound_port = s.options.port == 0 ? s.http.bind_to_any_port(s.options.host) : (s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1);
  RLX_CHECK(s.bound_port > 0, "rlx serve: cannot listen on {}:{} (in use, or not an address of this machine)", s.options.host, s.options.port);
  s.engine_thread = std::thread([&s] { s.engine_loop(); });
  s.http_thread = std::thread([&s] { s.http.listen_after_bind(); });
  // httplib's stop() before its loop runs is lost: started means running.
  for (int i = 0; i < 500 && !s.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  RLX_CHECK(s.http.is_running(), "rlx serve: the HTTP server did not start");
}

int Server::port() const { return impl_->bound_port; }

void Server::stop() {
  Impl& s = *impl_;
  if (!s.engine_thread.joinable()) return;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  s.engine_thread.join();
  s.fail_all(ApiError(503, "the server is shutting down"));
  s.http.stop();
  if (s.http_thread.joinable()) s.http_thread.join();
}

}  // namespace rlx::serve
