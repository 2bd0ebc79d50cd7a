// Transport security and settings shared by the hub and its clients.
//
// The hub's ROUTER and every client's DEALER carry rlx frames (message.hpp) over ZeroMQ:
// ipc:// and inproc:// on one host, tcp:// across hosts. tcp:// can be secured with
// CURVE: the hub has a key pair, each client has one and knows the hub's public key, and
// a ZAP handler in the hub admits only the client public keys listed in a file (CURVE
// alone would let any client with any key in).
//
//   rlx keys generate --out keys --name hub      # keys/hub.key (secret) + keys/hub.pub
//   rlx keys generate --out keys --name worker0
//   cat keys/worker0.pub >> keys/allowed_clients
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "rlx/core/config.hpp"

namespace rlx::bus {

// A CURVE key pair in Z85 text (40 characters each).
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;  // empty when read from a .pub file
};

CurveKeyPair generate_curve_keys();
// Writes DIR/NAME.key (public and secret, mode 0600) and DIR/NAME.pub (public only).
// Refuses to overwrite an existing key file.
void write_curve_keys(const CurveKeyPair& keys, const std::filesystem::path& dir, const std::string& name);
// Reads a file written by write_curve_keys; errors name the file and line.
CurveKeyPair read_curve_keys(const std::filesystem::path& file);
// Public keys, one per line ("public = KEY" or a bare KEY); comment lines start with '#', and
// " #" starts a trailing comment ('#' alone is a Z85 character).
std::vector<std::string> read_public_keys(const std::filesystem::path& file);
// Whether `key` is 40 characters of the Z85 alphabet.
bool is_z85_key(const std::string& key);

struct CurveOptions {
  std::string key_file;             // this side's NAME.key; empty: no CURVE
  std::string server_key_file;      // clients: the hub's NAME.pub
  std::string allowed_clients_file; // hub: the client public keys admitted
  template <class V>
  void visit(V& v) {
    v("key_file", key_file, "this side's CURVE key file (NAME.key from `rlx keys generate`); empty: no encryption");
    v("server_key_file", server_key_file, "clients: the hub's public key file (NAME.pub)");
    v("allowed_clients_file", allowed_clients_file, "hub: file of admitted client public keys, one per line");
  }
  bool enabled() const { return !key_file.empty(); }
};

}  // namespace rlx::bus
