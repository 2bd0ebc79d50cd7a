// `rlx k8s render`: the Kubernetes manifest of a run's plan (see roles.hpp).
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <set>

#include "rlx/core/config.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/launch/tasks.hpp"

namespace rlx::launch {

using Manifest = nlohmann::ordered_json;  // keys in the order Kubernetes manifests are read

namespace {

Manifest metadata(const std::string& name, const K8sOptions& o, const std::string& run) {
  Manifest m;
  m["name"] = name;
  if (!o.namespace_.empty()) m["namespace"] = o.namespace_;
  m["labels"]["app.kubernetes.io/name"] = "rlx";
  m["labels"]["rlx/run"] = run;
  return m;
}

Manifest env_var(const std::string& name, const std::string& value) {
  Manifest e;
  e["name"] = name;
  e["value"] = value;
  return e;
}

// JSON as block YAML, keeping types: a string that would read back as a number, boolean or
// null is quoted (Kubernetes wants env values as strings); a multi-line one is a literal block.
void emit(YAML::Emitter& out, const Manifest& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& v : j) emit(out, v);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    static const std::set<std::string> typed{"true", "false", "True", "False", "TRUE", "FALSE", "null", "Null", "NULL", "~",
                                             "yes", "no", "on", "off", "Yes", "No", "On", "Off", "y", "n"};
    bool plain_string = false;
    try {
      const auto n = YAML::Load(s);
      plain_string = n.IsScalar() && n.Tag() == "?" && n.Scalar() == s && !typed.contains(s);
      if (plain_string) {
        try {
          (void)n.as<double>();
          plain_string = false;  // a number
        } catch (const YAML::Exception&) {
        }
      }
    } catch (const YAML::Exception&) {
    }
    if (s.find('\n') != std::string::npos) out << YAML::Literal << s;
    else if (!plain_string) out << YAML::DoubleQuoted << s;
    else out << s;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number()) {
    out << j.get<double>();
  } else {
    out << YAML::Null;
  }
}

// Kubernetes object names: lowercase letters, digits and '-', at most 63 characters.
std::string dns_name(const std::string& run) {
  std::string out = "rlx-";
  for (const char c : run) out += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-';
  RLX_CHECK(out.size() <= 52, "k8s: run.name '{}' is too long for Kubernetes names (at most 48 characters)", run);
  while (out.back() == '-') out.pop_back();
  return out;
}

}  // namespace

std::string render_k8s(const RunConfig& cfg_in, const K8sOptions& o) {
  RLX_CHECK(!o.image.empty(), "k8s: --image is empty");
  auto cfg = cfg_in;
  cfg.run.out_dir = "/runs";  // the run volume inside every pod
  const int tasks = 1 + static_cast<int>(cfg.train.learner_ranks) + static_cast<int>(worker_processes(cfg));
  const auto name = dns_name(cfg.run.name);

  Manifest service;
  service["apiVersion"] = "v1";
  service["kind"] = "Service";
  service["metadata"] = metadata(name, o, cfg.run.name);
  service["spec"]["clusterIP"] = "None";  // headless: a DNS name per pod
  service["spec"]["publishNotReadyAddresses"] = true;
  service["spec"]["selector"]["rlx/run"] = cfg.run.name;

  Manifest config_map;
  config_map["apiVersion"] = "v1";
  config_map["kind"] = "ConfigMap";
  config_map["metadata"] = metadata(name + "-config", o, cfg.run.name);
  config_map["data"]["config.yaml"] = config::to_yaml(cfg);

  Manifest pod;
  pod["subdomain"] = name;
  pod["restartPolicy"] = "Never";  // a task restarts its own role; a failed run is resumed by a new Job
  // One node: the roles share its network (the learner group's store on 127.0.0.1),
  // /dev/shm (weights) and the run directory.
  pod["hostNetwork"] = true;
  pod["dnsPolicy"] = "ClusterFirstWithHostNet";
  Manifest term;
  term["labelSelector"]["matchLabels"]["rlx/run"] = cfg.run.name;
  term["topologyKey"] = "kubernetes.io/hostname";
  pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].push_back(term);
  Manifest c;
  c["name"] = "rlx";
  c["image"] = o.image;
  c["command"].push_back("rlx");
  c["command"].push_back("run");
  c["command"].push_back("/etc/rlx/config.yaml");
  if (o.resume) c["command"].push_back("--resume");
  Manifest index;
  index["name"] = "RLX_TASK_INDEX";
  index["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.annotations['batch.kubernetes.io/job-completion-index']";
  c["env"].push_back(index);
  c["env"].push_back(env_var("RLX_NUM_TASKS", std::to_string(tasks)));
  c["env"].push_back(env_var("RLX_TASK_GROUP", name));
  if (cfg.run.threads > 0) c["resources"]["requests"]["cpu"] = std::to_string(cfg.run.threads);
  auto mount = [](const char* volume, const char* path) {
    Manifest m;
    m["name"] = volume;
    m["mountPath"] = path;
    return m;
  };
  c["volumeMounts"].push_back(mount("config", "/etc/rlx"));
  c["volumeMounts"].push_back(mount("runs", "/runs"));
  c["volumeMounts"].push_back(mount("shm", "/dev/shm"));
  pod["containers"].push_back(c);
  Manifest v_config, v_runs, v_shm;
  v_config["name"] = "config";
  v_config["configMap"]["name"] = name + "-config";
  v_runs["name"] = "runs";
  if (o.claim.empty()) {
    v_runs["hostPath"]["path"] = o.host_path;
    v_runs["hostPath"]["type"] = "DirectoryOrCreate";
  } else {
    v_runs["persistentVolumeClaim"]["claimName"] = o.claim;
  }
  v_shm["name"] = "shm";
  v_shm["hostPath"]["path"] = "/dev/shm";
  pod["volumes"] = Manifest::array({v_config, v_runs, v_shm});

  Manifest job;
  job["apiVersion"] = "batch/v1";
  job["kind"] = "Job";
  job["metadata"] = metadata(name, o, cfg.run.name);
  job["spec"]["completionMode"] = "Indexed";
  job["spec"]["completions"] = tasks;
  job["spec"]["parallelism"] = tasks;
  job["spec"]["backoffLimit"] = 0;
  job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "rlx";
  job["spec"]["template"]["metadata"]["labels"]["rlx/run"] = cfg.run.name;
  job["spec"]["template"]["spec"] = pod;

  YAML::Emitter out;
  for (const auto* doc : {&service, &config_map, &job}) {
    out << YAML::BeginDoc;
    emit(out, *doc);
  }
  RLX_CHECK(out.good(), "k8s: cannot emit the manifest: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace rlx::launch
