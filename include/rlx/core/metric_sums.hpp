// Named sums a loss function reports over a step's micro-batches (clipped tokens, KL, ...).
// A tensor added stays on its device, detached: the learner reads every sum in one copy
// after the step's last backward, so no micro-batch waits for its GPU queue to drain (an
// `.item()` per metric did, before each backward).
//
//   sums.add("clipped_tokens", (clipped * mask).sum());   // a one-element tensor
//   sums.add("tokens", 128.0);                            // or a host number
//   sums.add(bin_names, counts);                          // a vector: one name an element
//   std::map<std::string, double> v = sums.values();      // the only device read
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

namespace rlx {

class MetricSums {
 public:
  void add(const std::string& name, double value);
  void add(const std::string& name, const at::Tensor& value);
  void add(const std::vector<std::string>& names, const at::Tensor& values);

  // Every name added so far, sorted.
  std::vector<std::string> names() const;
  // Every sum as a double (the tensors' in the order added, then the host numbers).
  std::map<std::string, double> values() const;

 private:
  std::map<std::string, double> host_;
  struct Pending {
    std::vector<std::string> names;
    at::Tensor values;  // fp64 [names.size()], detached, on the device it was added on
  };
  std::vector<Pending> pending_;
};

}  // namespace rlx
