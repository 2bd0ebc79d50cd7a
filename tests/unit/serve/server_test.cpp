#include "rlx/serve/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "rlx/model/config.hpp"

// rlx serve over real sockets, as hostile clients use it: each case is an attack found on a
// running server, and checks that it gets a clear 4xx and that every other request goes on.
// The server runs in this process on a tiny model with a character tokenizer.

using namespace rlx::serve;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

const char* kTemplate =
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if tools %}{{ tools | length }} tools\n{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

struct TinyServer {
  std::shared_ptr<const rlx::Tokenizer> tok = std::make_shared<rlx::CharTokenizer>(rlx::default_char_alphabet());
  std::shared_ptr<rlx::Transformer> model;
  std::unique_ptr<rlx::Engine> engine;
  std::unique_ptr<Server> server;

  explicit TinyServer(ServeLimits limits) {
    auto c = rlx::model_preset("tiny", rlx::Arch::qwen2);
    c.vocab_size = tok->vocab_size();
    model = std::make_shared<rlx::Transformer>(c);
    model->init_weights(1);
    engine = std::make_unique<rlx::Engine>(model, rlx::EngineConfig{.kv_cache_mb = 16, .max_batch_tokens = 512}, tok);
    ServedModel m;
    m.name = "tiny";
    m.tokenizer = tok;
    m.chat_template = rlx::chat::ChatTemplate::from_source(kTemplate, json::object(), "test template");
    m.max_model_len = engine->max_model_len();
    server = std::make_unique<Server>(*engine, m, ServerOptions{.host = "127.0.0.1", .port = 0, .limits = limits});
    server->start();
  }
  ~TinyServer() { server->stop(); }
  int port() const { return server->port(); }
};

// A TCP connection to 127.0.0.1:port, from `from` (another loopback address: another peer).
int connect_to(int port, const char* from = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{.tv_sec = 30, .tv_usec = 0};  // no test waits this long for a byte it expects
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (from) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &local.sin_addr);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Everything until the server closes (or 30 s without a byte).
std::string read_to_end(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Reads until `text` has arrived `times` times (true) or the connection ends (false).
bool read_until(int fd, std::string& got, const std::string& text, size_t times = 1) {
  char buf[65536];
  while (count_of(got, text) < times) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return true;
}

struct Reply {
  int status = 0;
  std::string body;
  json error() const { return json::parse(body).at("error"); }
};

Reply parse_reply(const std::string& raw) {
  Reply r;
  if (raw.rfind("HTTP/1.1 ", 0) == 0) r.status = std::stoi(raw.substr(9, 3));
  auto at = raw.find("\r\n\r\n");
  if (at != std::string::npos) r.body = raw.substr(at + 4);
  return r;
}

std::string post_head(const std::string& path, size_t length) {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
         std::to_string(length) + "\r\n\r\n";
}

Reply post(int port, const std::string& path, const std::string& body) {
  int fd = connect_to(port);
  REQUIRE(send_all(fd, post_head(path, body.size()) + body));
  Reply r = parse_reply(read_to_end(fd));
  ::close(fd);
  return r;
}

Reply get(int port, const std::string& path, const char* from = nullptr) {
  int fd = connect_to(port, from);
  REQUIRE(send_all(fd, "GET " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  Reply r = parse_reply(read_to_end(fd));
  ::close(fd);
  return r;
}

int64_t in_flight(int port) { return json::parse(get(port, "/health").body).at("in_flight").get<int64_t>(); }

json chat(json extra = json::object()) {
  json b = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "1+1="}}}}, {"max_tokens", 4}, {"ignore_eos", true}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

// Polls until `done` or `limit` passes; whether it came true.
template <class F>
bool eventually(F done, std::chrono::seconds limit) {
  for (auto until = Clock::now() + limit; Clock::now() < until; std::this_thread::sleep_for(std::chrono::milliseconds(20)))
    if (done()) return true;
  return done();
}

}  // namespace

TEST_CASE("serve: JSON nested 50,000 deep or with 1e999 is a 400 naming the body; the server goes on", "[serve]") {
  TinyServer s({});
  const std::string deep = nested(50000);  // 100 KB
  const std::string base = R"({"model": "tiny", "max_tokens": 4, )";
  for (const std::string& body :
       {base + R"("messages": [{"role": "user", "content": )" + deep + "}]}",
        base + R"("messages": [{"role": "user", "content": "hi"}], "tools": )" + deep + "}",
        base + R"("messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": )" + deep + "}}"}) {
    Reply r = post(s.port(), "/v1/chat/completions", body);
    CHECK(r.status == 400);
    CHECK_THAT(r.error()["message"].get<std::string>(), Catch::Contains("the request body") && Catch::Contains("nested deeper than 128"));
  }
  // A number beyond a double: 400, not 500.
  Reply huge = post(s.port(), "/v1/chat/completions", R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 1e999})");
  CHECK(huge.status == 400);
  CHECK_THAT(huge.error()["message"].get<std::string>(), Catch::Contains("out of range"));
  // Nesting within the bound is served.
  Reply ok = post(s.port(), "/v1/chat/completions", chat({{"chat_template_kwargs", {{"x", json::parse(nested(100))}}}}).dump());
  CHECK(ok.status == 200);
  CHECK(json::parse(ok.body)["usage"]["completion_tokens"] == 4);
}

TEST_CASE("serve: a temperature fp32 cannot sample at is a 400 for that request alone", "[serve]") {
  TinyServer s({});
  // A long streamed request, surely running (its first token came) when the bad one arrives.
  int good = connect_to(s.port());
  json body = {{"model", "tiny"}, {"prompt", "12+3="}, {"max_tokens", 1000}, {"ignore_eos", true}, {"stream", true}, {"seed", 1}};
  REQUIRE(send_all(good, post_head("/v1/completions", body.dump().size()) + body.dump()));
  std::string stream;
  REQUIRE(read_until(good, stream, "data: ", 2));  // the opening chunk and a token's
  for (double t : {1e-39, 1e-300, 0.005}) {
    Reply bad = post(s.port(), "/v1/completions", json{{"model", "tiny"}, {"prompt", "1"}, {"max_tokens", 5}, {"temperature", t}}.dump());
    CHECK(bad.status == 400);
    CHECK(bad.error()["param"] == "temperature");
    CHECK_THAT(bad.error()["message"].get<std::string>(), Catch::Contains("0.01"));
  }
  stream += read_to_end(good);
  ::close(good);
  CHECK(stream.find("\"error\"") == std::string::npos);
  CHECK(stream.find("\"finish_reason\":\"length\"") != std::string::npos);
  CHECK(stream.find("data: [DONE]") != std::string::npos);
  // 0 (greedy) and 0.01 are served.
  CHECK(post(s.port(), "/v1/completions", json{{"model", "tiny"}, {"prompt", "1"}, {"max_tokens", 3}, {"temperature", 0}}.dump()).status == 200);
  CHECK(post(s.port(), "/v1/completions", json{{"model", "tiny"}, {"prompt", "1"}, {"max_tokens", 3}, {"temperature", 0.01}}.dump()).status == 200);
}

TEST_CASE("serve: bodies over --max-body-kb are 413 however they are framed; the server goes on", "[serve]") {
  ServeLimits limits;
  limits.max_body_bytes = 64 << 10;
  TinyServer s(limits);
  SECTION("chunked: refused once past the limit, not read whole") {
    int fd = connect_to(s.port());
    REQUIRE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
    // 1 MiB of a valid JSON body in 16 KiB chunks, sent while the answer is read.
    std::thread sender([fd] {
      std::string start = R"({"model": "tiny", "prompt": ")";
      send_all(fd, fmt::format("{:x}\r\n{}\r\n", start.size(), start));
      const std::string chunk(16 << 10, 'x');
      for (int i = 0; i < 64; ++i)
        if (!send_all(fd, fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk))) return;
      send_all(fd, "2\r\n\"}\r\n0\r\n\r\n");
    });
    std::string got;
    read_until(fd, got, "\r\n\r\n");
    Reply r = parse_reply(got + read_to_end(fd));
    sender.join();
    ::close(fd);
    CHECK(r.status == 413);
    CHECK_THAT(r.error()["message"].get<std::string>(), Catch::Contains("over 65536 bytes"));
  }
  SECTION("a Content-Length over the limit: refused before the body") {
    int fd = connect_to(s.port());
    REQUIRE(send_all(fd, post_head("/v1/completions", 100u << 20)));  // and no body at all
    Reply r = parse_reply(read_to_end(fd));
    ::close(fd);
    CHECK(r.status == 413);
  }
  SECTION("neither a length nor chunks: 411; endless headers: 431") {
    int fd = connect_to(s.port());
    REQUIRE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n{}"));
    Reply r = parse_reply(read_to_end(fd));
    ::close(fd);
    CHECK(r.status == 411);
    fd = connect_to(s.port());
    REQUIRE(send_all(fd, "GET /health HTTP/1.1\r\nHost: t\r\n"));
    std::thread sender([fd] {
      for (int i = 0; i < 20000; ++i)
        if (!send_all(fd, fmt::format("X-Filler-{}: {}\r\n", i, std::string(100, 'y')))) return;
    });
    std::string got;
    read_until(fd, got, "\r\n\r\n");
    sender.join();
    ::close(fd);
    CHECK(parse_reply(got).status == 431);
  }
  CHECK(get(s.port(), "/health").status == 200);
  CHECK(post(s.port(), "/v1/completions", json{{"model", "tiny"}, {"prompt", "1"}, {"max_tokens", 2}}.dump()).status == 200);
}

TEST_CASE("serve: slow clients neither starve /health nor keep a connection past the read deadline", "[serve]") {
  SECTION("20 trickling connections from one address: 8 held (the limit per address), 12 refused at once; /health answers") {
    ServeLimits limits;
    limits.max_in_flight = 2;  // httplib's old pool: 2 * 2 + 8 = 12 threads
    limits.max_connections_per_peer = 8;
    limits.request_read_timeout_s = 60;  // longer than this test: nothing here ends by the deadline
    TinyServer s(limits);
    std::vector<int> slow;
    for (int i = 0; i < 20; ++i) {
      slow.push_back(connect_to(s.port(), "127.0.0.2"));
      REQUIRE(send_all(slow.back(), "POST /v1/completions HTTP/1.1\r\nHost: t\r\nX-Slow: "));
    }
    // The refused ones are answered at once; the others get nothing while they trickle
    // (checked below, once /health has answered).
    int refused = 0;
    std::vector<pollfd> waiting;
    for (int fd : slow) waiting.push_back({fd, POLLIN, 0});
    for (auto until = Clock::now() + std::chrono::seconds(20); refused < 12 && Clock::now() < until;) {
      if (::poll(waiting.data(), waiting.size(), 100) <= 0) continue;
      for (auto& p : waiting) {
        if (p.fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        std::string got;
        read_until(p.fd, got, "\r\n\r\n");
        CHECK(parse_reply(got).status == 429);
        ++refused;
        p.fd = -1;  // poll skips it
      }
    }
    CHECK(refused == 12);
    std::atomic<bool> stop{false};
    std::thread trickler([&] {
      while (!stop) {
        for (int fd : slow) send_all(fd, "z");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
    // Another address is served while they hold their connections (checked after: still open).
    CHECK(get(s.port(), "/health").status == 200);
    CHECK(post(s.port(), "/v1/completions", json{{"model", "tiny"}, {"prompt", "1"}, {"max_tokens", 2}}.dump()).status == 200);
    int still_open = 0;
    for (int fd : slow) {
      pollfd p{fd, POLLIN, 0};
      still_open += ::poll(&p, 1, 0) == 0;
    }
    CHECK(still_open == 8);
    stop = true;
    trickler.join();
    for (int fd : slow) ::close(fd);
  }
  SECTION("a connection trickling a byte every 100 ms is answered 408 and closed at the deadline") {
    ServeLimits limits;
    limits.request_read_timeout_s = 1;
    TinyServer s(limits);
    int fd = connect_to(s.port());
    REQUIRE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nX-Slow: "));
    std::atomic<bool> stop{false};
    std::atomic<int> sent{0};
    std::thread trickler([&] {
      while (!stop && send_all(fd, "z")) {
        ++sent;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    // A closed connection (recv returns 0, or fails once the trickle meets the closed socket),
    // not one held for ever: each byte restarted the old per-read timeout.
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    const bool timed_out = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // 30 s without a byte or a close
    stop = true;
    trickler.join();
    ::close(fd);
    CHECK_FALSE(timed_out);
    CHECK(parse_reply(got).status == 408);
    CHECK(sent > 3);  // it kept sending
    CHECK(get(s.port(), "/health").status == 200);
  }
}

TEST_CASE("serve: a client that leaves ends its request, streamed or not", "[serve]") {
  ServeLimits limits;
  limits.request_timeout_s = 600;
  TinyServer s(limits);
  // The engine is paused: nothing generates, so the requests can only end by their clients
  // leaving, whatever this machine's speed.
  s.engine->pause();
  for (bool streamed : {false, true}) {
    INFO("stream: " << streamed);
    int fd = connect_to(s.port());
    json body = {{"model", "tiny"}, {"prompt", "12+3="}, {"max_tokens", 500}, {"n", 4}, {"stream", streamed}};
    REQUIRE(send_all(fd, post_head("/v1/completions", body.dump().size()) + body.dump()));
    REQUIRE(eventually([&] { return in_flight(s.port()) == 1; }, std::chrono::seconds(20)));
    if (streamed) {
      std::string got;
      REQUIRE(read_until(fd, got, "data: "));
    }
    ::close(fd);
    CHECK(eventually([&] { return in_flight(s.port()) == 0; }, std::chrono::seconds(20)));
  }
  s.engine->resume();
  // The engine drops them (aborted, nothing left to run) and serves the next request.
  Reply r = post(s.port(), "/v1/completions", json{{"model", "tiny"}, {"prompt", "1"}, {"max_tokens", 3}, {"ignore_eos", true}}.dump());
  CHECK(r.status == 200);
  CHECK(json::parse(r.body)["usage"]["completion_tokens"] == 3);
}
