// Fault injection for the crash and recovery tests: named points in the code where a test
// makes this process die (SIGKILL, as a real crash would) or stall. Faults are armed by
// environment variables, read here only (and read again when one of them changes):
//
//   RLX_FAULT=slow-start:ROLE:SECONDS            the first start of ROLE (index 0) is SECONDS
//                                                late to its first heartbeat (0 to 600)
//   RLX_FAULT=slow-checkpoint:SECONDS            the learner's first checkpoint takes SECONDS longer
//   RLX_FAULT=kill-after-episode-checkpoint:W:N  worker W dies after its N-th episode checkpoint
//   RLX_CHECKPOINT_CRASH_AT=POINT                a learner rank dies as its checkpoint save
//                                                reaches POINT: shards, shards-agreed, manifest, renamed
//     RLX_CHECKPOINT_CRASH_RANK=R (default 0), RLX_CHECKPOINT_CRASH_STEP=S (default: any step),
//     RLX_CHECKPOINT_CRASH_ONCE=FILE
//   RLX_COMM_CRASH=RANK:N:WHAT                   rank RANK dies as it starts its N-th collective
//                                                whose description contains WHAT
//     RLX_COMM_CRASH_ONCE=FILE
//
// A *_ONCE file makes its fault fire only while that file does not exist (it is created as
// the fault fires, so the restarted process runs on); RLX_FAULT's faults fire once per run
// directory (the code that asks passes the run directory's marker file as Site::once_file).
// A malformed value is an rlx::Error naming the expected form, an unknown point one naming
// the known points.
//
//   rlx::fault::crash_at(rlx::fault::Point::collective, {.rank = rank, .what = "layers.1 gradients"});
//   if (auto f = rlx::fault::fires(rlx::fault::Point::slow_checkpoint, {.rank = rank, .once_file = marker}))
//     std::this_thread::sleep_for(std::chrono::duration<double>(f->seconds));
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::fault {

// Every variable read here: a change to any of them arms the faults again.
inline constexpr std::array<const char*, 7> kVariables = {
    "RLX_FAULT",                 "RLX_CHECKPOINT_CRASH_AT", "RLX_CHECKPOINT_CRASH_RANK", "RLX_CHECKPOINT_CRASH_STEP",
    "RLX_CHECKPOINT_CRASH_ONCE", "RLX_COMM_CRASH",          "RLX_COMM_CRASH_ONCE"};

// The points a fault can be injected at; name() is how the variables above spell each.
enum class Point {
  slow_start,                     // slow-start (RLX_FAULT): a role's first start, before its first heartbeat
  slow_checkpoint,                // slow-checkpoint (RLX_FAULT): the learner's checkpoint, rank 0
  kill_after_episode_checkpoint,  // kill-after-episode-checkpoint (RLX_FAULT): a worker's episode checkpoint
  checkpoint_shards,              // shards (RLX_CHECKPOINT_CRASH_AT): a rank's shards written
  checkpoint_shards_agreed,       // shards-agreed: every rank wrote its shards
  checkpoint_manifest,            // manifest: rank 0 wrote the manifest
  checkpoint_renamed,             // renamed: rank 0 renamed the checkpoint into place
  collective,                     // collective (RLX_COMM_CRASH): a collective starts
};
std::string_view name(Point point);

// One armed fault: the point, and what must hold where the code asks for it to fire.
struct Fault {
  Point point = Point::collective;
  int rank = -1;          // the rank or role index it fires on (-1: any)
  std::string role;       // slow-start: the role (empty: any)
  int64_t step = -1;      // checkpoint points: the step being saved (-1: any)
  std::string what;       // collective: part of the collective's description (empty: any)
  uint64_t nth = 0;       // collective: fires at the nth site that matches (0: every match)
  uint64_t after = 0;     // kill-after-episode-checkpoint: fires once the site's count reaches it
  double seconds = 0;     // slow-start, slow-checkpoint: how long
  std::string once_file;  // fires only while this file does not exist (empty: the site's, if any)
};

// Where the code is when it asks: what a fault's fields are matched against.
struct Site {
  int rank = 0;                     // this process's rank or role index
  std::string_view role;            // this process's role
  int64_t step = -1;                // the step being saved
  std::string_view what;            // the collective's description
  uint64_t count = 0;               // how many times the site was reached (episode checkpoints saved)
  std::filesystem::path once_file;  // for a fault without its own once file (RLX_FAULT's run marker)
};

// The faults the environment variables arm (none: empty). Throws rlx::Error for a
// malformed value or an unknown point.
std::vector<Fault> from_env();

// Whether a fault is armed at `point` (it may still not match a site).
bool armed(Point point);

// The fault armed at `point` if it fires at `site`: every field matches, it is the nth match,
// and its once file did not exist (it is created now). Cheap when nothing is armed.
std::optional<Fault> fires(Point point, const Site& site);

// SIGKILL to this process if a fault at `point` fires at `site`.
void crash_at(Point point, const Site& site);

}  // namespace rlx::fault
