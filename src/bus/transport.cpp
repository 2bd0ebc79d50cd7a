#include "transport.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string_view>

#include "rlx/core/error.hpp"
#include "rlx/core/log.hpp"

namespace rlx::bus {

bool is_z85_key(const std::string& key) {
  static constexpr std::string_view kZ85 =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return key.size() == 40 && key.find_first_not_of(kZ85) == std::string::npos;
}

CurveKeyPair generate_curve_keys() {
  RLX_CHECK(zmq_has("curve"), "this libzmq was built without CURVE support");
  char pub[41] = {}, sec[41] = {};
  RLX_CHECK(zmq_curve_keypair(pub, sec) == 0, "zmq_curve_keypair failed: {}", zmq_strerror(zmq_errno()));
  return {pub, sec};
}

void write_curve_keys(const CurveKeyPair& keys, const std::filesystem::path& dir, const std::string& name) {
  RLX_CHECK(!name.empty() && name.find('/') == std::string::npos, "key name '{}' must be a plain file name", name);
  std::filesystem::create_directories(dir);
  const auto key_file = dir / (name + ".key"), pub_file = dir / (name + ".pub");
  RLX_CHECK(!std::filesystem::exists(key_file), "{} exists; refusing to overwrite a key", key_file.string());
  {
    const mode_t old = umask(077);  // the secret key is readable by its owner only
    std::ofstream out(key_file);
    umask(old);
    RLX_CHECK(out.good(), "cannot write {}", key_file.string());
    out << "# rlx CURVE key pair '" << name << "': keep secret\npublic = " << keys.public_key
        << "\nsecret = " << keys.secret_key << "\n";
  }
  std::ofstream pub(pub_file);
  RLX_CHECK(pub.good(), "cannot write {}", pub_file.string());
  pub << "# rlx CURVE public key '" << name << "'\npublic = " << keys.public_key << "\n";
}

namespace {
// Calls f(lineno, key, value) for each "key = value" or bare-value line; '#' comments.
template <class F>
void read_key_lines(const std::filesystem::path& file, F&& f) {
  std::ifstream in(file);
  RLX_CHECK(in.good(), "cannot read key file {}", file.string());
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (const auto first = line.find_first_not_of(" \t"); first != std::string::npos && line[first] == '#') continue;
    if (auto hash = line.find(" #"); hash != std::string::npos) line.resize(hash);  // '#' is a Z85 character
    auto trim = [](std::string s) {
      const auto a = s.find_first_not_of(" \t\r\"'"), b = s.find_last_not_of(" \t\r\"'");
      return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    std::string key, value = line;
    if (auto eq = line.find('='); eq != std::string::npos && eq + 1 < line.size() && line.size() != 40) {
      key = trim(line.substr(0, eq));
      value = trim(line.substr(eq + 1));
    }
    RLX_CHECK(is_z85_key(value), "{}:{}: not a 40-character Z85 CURVE key", file.string(), lineno);
    f(lineno, key, value);
  }
}
}  // namespace

CurveKeyPair read_curve_keys(const std::filesystem::path& file) {
  CurveKeyPair keys;
  read_key_lines(file, [&](size_t lineno, const std::string& key, const std::string& value) {
    if (key == "public") keys.public_key = value;
    else if (key == "secret") keys.secret_key = value;
    else throw Error(fmt::format("{}:{}: expected 'public = KEY' or 'secret = KEY'", file.string(), lineno));
  });
  RLX_CHECK(!keys.public_key.empty(), "{}: no public key", file.string());
  return keys;
}

std::vector<std::string> read_public_keys(const std::filesystem::path& file) {
  std::vector<std::string> out;
  read_key_lines(file, [&](size_t lineno, const std::string& key, const std::string& value) {
    RLX_CHECK(key.empty() || key == "public", "{}:{}: a secret key does not belong in a list of public keys",
              file.string(), lineno);
    out.push_back(value);
  });
  return out;
}

namespace detail {

bool poll(zmq::pollitem_t* items, size_t n, std::chrono::milliseconds timeout) {
  try {
    zmq::poll(items, n, timeout);
    return true;
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
    return false;
  }
}

IpcFile::IpcFile(const std::string& endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  if (!endpoint.starts_with(kIpc) || endpoint.find('*') != std::string::npos) return;
  struct stat st {};
  const auto path = endpoint.substr(kIpc.size());
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  path_ = path, dev_ = st.st_dev, ino_ = st.st_ino;
}

IpcFile::~IpcFile() {
  struct stat st {};
  if (!path_.empty() && ::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
}

zmq::context_t& shared_context() {
  static zmq::context_t context(1);
  return context;
}

void configure_socket(zmq::socket_t& socket, const Limits& limits, int hwm) {
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndhwm, hwm);
  socket.set(zmq::sockopt::rcvhwm, hwm);
  socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_frame_bytes + kHeaderBytes));
}

void make_curve_server(zmq::socket_t& socket, const CurveOptions& curve) {
  const auto keys = read_curve_keys(curve.key_file);
  RLX_CHECK(!keys.secret_key.empty(), "{}: the hub needs its secret key (a NAME.key file)", curve.key_file);
  RLX_CHECK(!curve.allowed_clients_file.empty(),
            "curve.allowed_clients_file is required with curve.key_file: CURVE without an allow-list admits any client");
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  socket.set(zmq::sockopt::zap_domain, "rlx");
}

void make_curve_client(zmq::socket_t& socket, const CurveOptions& curve) {
  const auto keys = read_curve_keys(curve.key_file);
  RLX_CHECK(!keys.secret_key.empty(), "{}: a client needs its secret key (a NAME.key file)", curve.key_file);
  RLX_CHECK(!curve.server_key_file.empty(), "curve.server_key_file (the hub's NAME.pub) is required with curve.key_file");
  const auto server = read_curve_keys(curve.server_key_file);
  socket.set(zmq::sockopt::curve_serverkey, server.public_key);
  socket.set(zmq::sockopt::curve_publickey, keys.public_key);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
}

ZapHandler::ZapHandler(zmq::context_t& context, std::set<std::string> allowed_z85)
    : socket_(context, zmq::socket_type::rep), allowed_(std::move(allowed_z85)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { serve(); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  thread_.join();
}

void ZapHandler::serve() {
  while (!stop_) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    detail::poll(&item, 1, std::chrono::milliseconds(100));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    // ZAP 1.0: version, request id, domain, address, identity, mechanism, credentials...
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(socket_, std::back_inserter(parts))) continue;
    std::string request_id = parts.size() > 1 ? parts[1].to_string() : "";
    bool ok = false;
    std::string peer_key;
    if (parts.size() >= 7 && parts[0].to_string() == "1.0" && parts[5].to_string() == "CURVE" && parts[6].size() == 32) {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(parts[6].data()), 32);
      peer_key = z85;
      ok = allowed_.contains(peer_key);
    }
    ok ? ++accepted_ : ++refused_;
    if (!ok)
      log::warn("bus: refused a connection from {} (key {})", parts.size() > 3 ? parts[3].to_string() : "?",
                peer_key.empty() ? "none" : peer_key);
    const std::string reply[] = {"1.0", request_id, ok ? "200" : "400", ok ? "OK" : "client key not allowed",
                                 ok ? peer_key : "", ""};
    for (size_t i = 0; i < 6; ++i)
      socket_.send(zmq::buffer(reply[i]), i + 1 < 6 ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

namespace {
// Large frames go to ZeroMQ without a copy: the message keeps the bytes' owner alive.
zmq::message_t as_message(SharedBytes bytes) {
  if (bytes.size < 4096) return zmq::message_t(bytes.data.get(), bytes.size);
  const char* data = bytes.data.get();
  auto* keep = new std::shared_ptr<const char>(std::move(bytes.data));
  return zmq::message_t(
      const_cast<char*>(data), bytes.size, [](void*, void* hint) { delete static_cast<std::shared_ptr<const char>*>(hint); },
      keep);
}
zmq::message_t as_message(std::shared_ptr<const std::string> frame) {
  const size_t n = frame->size();
  return as_message(SharedBytes{std::shared_ptr<const char>(frame, frame->data()), n});
}
}  // namespace

bool try_send(zmq::socket_t& socket, std::shared_ptr<const std::string> frame) {
  try {
    auto msg = as_message(std::move(frame));
    return socket.send(msg, zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}

bool try_send(zmq::socket_t& socket, const std::string& frame) {
  try {
    return socket.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}

bool try_send_to(zmq::socket_t& router, const std::string& routing_id, std::string frame, std::span<const SharedBytes> more) {
  try {
    // Only the first part can fail for lack of room: the rest of a message follows it.
    if (!router.send(zmq::buffer(routing_id), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
    auto head = as_message(std::make_shared<const std::string>(std::move(frame)));
    const auto flags = more.empty() ? zmq::send_flags::dontwait : zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    if (!router.send(head, flags)) return false;
    for (size_t i = 0; i < more.size(); ++i) {
      auto part = as_message(more[i]);
      if (!router.send(part, i + 1 < more.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                                  : zmq::send_flags::dontwait))
        return false;
    }
    return true;
  } catch (const zmq::error_t&) {
    return false;  // EHOSTUNREACH: the peer is gone (ROUTER_MANDATORY)
  }
}

}  // namespace detail
}  // namespace rlx::bus
