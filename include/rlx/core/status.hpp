// What this process is doing now, in words, for the people watching a run. A role sets it
// as it goes ("waiting for a batch from the hub (step 4)"); its heartbeat writes it where
// the launcher reads it, and the launcher prints it when a run goes quiet, so that a wait
// names what it waits on instead of ending in a timeout.
//
//   rlx::status::set(fmt::format("waiting for weights v{}", v));
//   {
//     rlx::status::Scope s("env call 'step' to ipc:///run/env.sock");  // the previous text comes back after
//     ...
//   }
//   rlx::status::ready();  // start-up is over: a failure from now on is not a failure to start
#pragma once

#include <string>

namespace rlx::status {

struct Snapshot {
  std::string what;   // "" before the first set()
  double since = 0;   // wall-clock seconds (Unix time) of that set()
  bool ready = false;  // ready() was called
};

void set(std::string what);
void ready();
Snapshot get();

// set() for a scope; the text before it comes back at its end.
class Scope {
 public:
  explicit Scope(std::string what);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Snapshot before_;
};

}  // namespace rlx::status
