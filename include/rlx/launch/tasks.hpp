// A run as the tasks of a scheduler: Slurm (`srun`) or a Kubernetes Indexed Job.
#pragma once

#include <optional>
#include <string>

#include "rlx/launch/config.hpp"
#include "rlx/launch/role.hpp"

namespace rlx::launch {

// A run as many tasks: under Slurm (`srun -n T rlx run CONFIG`, T > 1, by SLURM_PROCID
// and SLURM_NTASKS) or as a Kubernetes Indexed Job (`rlx k8s render`: RLX_TASK_INDEX,
// RLX_NUM_TASKS, RLX_TASK_GROUP), each task is one role of the plan: 0 the hub (it also
// prepares the run directory, hosts the learner group's store and prints the progress),
// 1..L the learner ranks (train.learner_ranks), then the W rollout workers
// (rollout.workers): T must be 1 + L + W. Each task runs its role as a child with the local
// launcher's policies (heartbeats; a worker is restarted up to rollout.max_restarts times);
// a dead hub or learner rank fails the whole group with an error naming it, and `--resume`
// (or a requeued job) continues from the last checkpoint. The tasks coordinate through
// files in run_dir/tasks/GROUP/, so the run directory must be shared (NFS, Lustre) when
// they span nodes; weights go through /dev/shm on one node, over tcp across nodes
// (train.transport).
struct RoleTask {
  int procid = 0, ntasks = 1;
  std::string group;  // names this start of the tasks (slurm-JOB.STEP.RESTARTS, or RLX_TASK_GROUP)
  Role role = Role::hub;
  int index = 0;      // learner rank or worker index
  bool tcp = false;   // train.transport: tcp (or auto, and the tasks span nodes)
};
// The task of this process, or none (a single process launches every role). A plan that
// does not fit the tasks is a ConfigError naming the keys.
std::optional<RoleTask> task_from_env(const RunConfig& cfg);

// `rlx k8s render`: a headless Service, a ConfigMap with the resolved config, and an
// Indexed Job of 1 + L + W pods, each running `rlx run` as one task of the plan. The pods
// share one node (pod affinity), its network and /dev/shm, and the run directory
// (a hostPath, or a ReadWriteMany claim).
struct K8sOptions {
  std::string image = "rlx:latest";
  std::string namespace_;      // empty: the current one
  std::string host_path = "/var/lib/rlx/runs";  // the run directories on the node
  std::string claim;           // a PersistentVolumeClaim instead of the hostPath
  bool resume = false;         // the pods run `rlx run --resume`
};
std::string render_k8s(const RunConfig& cfg, const K8sOptions& options);

}  // namespace rlx::launch
