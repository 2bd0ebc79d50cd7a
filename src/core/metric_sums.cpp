#include "rlx/core/metric_sums.hpp"

#include <set>

#include "rlx/core/error.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx {

void MetricSums::add(const std::string& name, double value) { host_[name] += value; }

void MetricSums::add(const std::string& name, const at::Tensor& value) {
  RLX_CHECK(value.defined() && value.numel() == 1, "metric {:?}: a sum is one number, got a tensor of shape {}", name,
            value.defined() ? value.sizes() : at::IntArrayRef{});
  add(std::vector<std::string>{name}, value.reshape({1}));
}

void MetricSums::add(const std::vector<std::string>& names, const at::Tensor& values) {
  RLX_CHECK(values.defined() && values.numel() == static_cast<int64_t>(names.size()),
            "metrics: {} names for a tensor of {} elements", names.size(), values.defined() ? values.numel() : 0);
  // A copy of our own (no view of the caller's tensor), converted on its device: no read yet.
  pending_.push_back({names, values.detach().reshape({-1}).to(at::kDouble, /*non_blocking=*/false, /*copy=*/true)});
}

std::vector<std::string> MetricSums::names() const {
  std::set<std::string> all;
  for (const auto& [name, v] : host_) all.insert(name);
  for (const auto& p : pending_) all.insert(p.names.begin(), p.names.end());
  return {all.begin(), all.end()};
}

std::map<std::string, double> MetricSums::values() const {
  std::map<std::string, double> out;
  // One copy a device: its pending vectors joined there, then read in the order added.
  std::map<std::string, std::vector<const Pending*>> by_device;
  for (const auto& p : pending_) by_device[p.values.device().str()].push_back(&p);
  for (const auto& [device, list] : by_device) {
    std::vector<at::Tensor> parts;
    for (const auto* p : list) parts.push_back(p->values);
    const auto joined = at::cat(parts).to(at::kCPU).contiguous();
    const double* v = joined.data_ptr<double>();
    for (const auto* p : list)
      for (const auto& name : p->names) out[name] += *v++;
  }
  for (const auto& [name, v] : host_) out[name] += v;
  return out;
}

}  // namespace rlx
