// A hub serving on its own thread for the duration of a test (real ZeroMQ sockets).
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "rlx/bus/hub.hpp"

namespace rlx::test {

struct HubThread {
  bus::Hub hub;
  std::atomic<bool> stop{false};
  std::thread thread;
  HubThread(bus::HubOptions o, std::vector<std::string> records) : hub(std::move(o), std::move(records)) {
    thread = std::thread([this] { hub.run(stop); });
  }
  ~HubThread() {
    stop = true;
    thread.join();
  }
};

}  // namespace rlx::test
