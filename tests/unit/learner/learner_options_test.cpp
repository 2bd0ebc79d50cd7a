#include <catch2/catch.hpp>

#include "rlx/learner/learner.hpp"

TEST_CASE("learner options: the learner trains on model.device, a group's ranks spread over the GPUs", "[learner]") {
  using rlx::learner_device;
  // As written: one rank, an index given, the CPU, or one GPU to share.
  CHECK(learner_device("cpu", 3, 4, 8) == at::Device(at::kCPU));
  CHECK(learner_device("cuda", 0, 1, 8) == at::Device("cuda"));
  CHECK(learner_device("cuda:2", 1, 4, 8) == at::Device("cuda:2"));
  CHECK(learner_device("cuda", 1, 2, 1) == at::Device("cuda"));
  // "cuda" for a group of several ranks: rank r on GPU r mod count.
  CHECK(learner_device("cuda", 0, 4, 4) == at::Device("cuda:0"));
  CHECK(learner_device("cuda", 3, 4, 4) == at::Device("cuda:3"));
  CHECK(learner_device("cuda", 5, 8, 4) == at::Device("cuda:1"));

  rlx::LearnerSection section;
  section.micro_batch_tokens = 4096;
  const auto o = rlx::learner_options(section, 7, at::Device("cuda:1"));
  CHECK(o.fsdp.device == at::Device("cuda:1"));
  CHECK(o.packing.micro_batch_tokens == 4096);
  CHECK(o.seed == 7);
}
