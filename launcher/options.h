/*
 * cohortrun's argument model: what the user asked for, parsed with CLI11 and checked, before
 * anything is started. torchrun's flag set is the model (--nnodes N or MIN:MAX,
 * --nproc-per-node N|auto|cpu|gpu, --node-rank, --rdzv-endpoint, --rdzv-id, --standalone,
 * --max-restarts, --monitor-interval, --log-dir, --redirects, --tee, --local-ranks-filter,
 * --master-addr/--master-port); both dashed and underscored spellings are accepted. Beyond
 * torchrun: --cpu-bind cores (mpirun's --bind-to core), --profile DIR, --help-env.
 *
 * Where the rendezvous happens (resolveEndpoint):
 *   --standalone            127.0.0.1 on a free port picked by this launcher (one node only);
 *   --rdzv-endpoint h:p     that address; the launcher with --node-rank 0 (or, without node
 *                           ranks, the one that can bind it) hosts the store there;
 *   --master-addr/-port     the same, when no --rdzv-endpoint is given (torchrun's static case);
 *   none of them            one node: as --standalone; several nodes: an error, never a silent
 *                           localhost default.
 *
 * Pure functions of their arguments; any thread.
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort::launcher {

// Bits of a worker's standard streams, as torchrun's --redirects/--tee values: 1 stdout, 2 stderr, 3 both.
enum StreamBits : int { kNoStreams = 0, kStdout = 1, kStderr = 2, kBothStreams = 3 };

// "3" (every local rank) or "0:1,2:3" (per local rank; ranks not named get 0).
struct StreamSpec {
  int all = kNoStreams;
  std::vector<std::pair<int, int>> perRank{};  // (local rank, bits)
  int forLocalRank(int localRank) const;
};
StreamSpec parseStreamSpec(const std::string& text, const char* flag);  // ValueError naming the flag

struct LaunchOptions {
  int minNodes = 1;
  int maxNodes = 1;
  std::string nprocPerNode = "1";  // as given
  int nproc = 1;                   // resolved
  std::optional<int> nodeRank{};
  std::string rdzvEndpoint{};  // host:port as given, may be empty
  std::string rdzvId{};        // run id; empty: generated (single node) or "none" is an error for several
  bool standalone = false;
  int maxRestarts = 0;
  double monitorInterval = 0.1;  // seconds between supervision checks of the store
  double rdzvTimeout = 900;      // seconds a rendezvous round may take
  double rdzvLastCall = 1.0;     // with MIN < MAX nodes: wait this long for more once MIN arrived
  double stopTimeout = 10;       // seconds between SIGTERM and SIGKILL when stopping workers
  std::string logDir{};
  StreamSpec redirects{};
  StreamSpec tee{};
  std::optional<std::vector<int>> localRanksFilter{};  // console shows only these local ranks
  std::string masterAddr{};
  std::optional<int> masterPort{};
  // Job profiling (distributed/job_profile.h): workers get COHORT_PROFILE=<absolute dir>, and the
  // rank traces left there are merged into <dir>/trace.json if the job did not merge them itself.
  std::string profileDir{};
  // "cores": each local rank (and every thread it starts) bound to its own slice of the CPUs this
  // launcher may use (util::cpuSlice); "none": the kernel places them.
  std::string cpuBind = "none";
  std::string program{};
  std::vector<std::string> programArgs{};
  bool helpEnv = false;
  bool version = false;
};

// The rendezvous address chosen from the options (see the header comment).
struct Endpoint {
  std::string host;
  uint16_t port = 0;   // 0: pick a free one (standalone)
  std::string origin;  // "--rdzv-endpoint", "--master-addr/--master-port", "--standalone", ...
  std::string str() const;
};
Endpoint resolveEndpoint(const LaunchOptions& o);

// "host:port", "[v6]:port"; ValueError naming the flag when malformed.
Endpoint parseHostPort(const std::string& text, const char* flag);

// Parses argv. Returns nullopt after printing --help/--version/--help-env or a usage error, with
// the exit code in *exitCode; otherwise the checked options.
std::optional<LaunchOptions> parseCommandLine(int argc, char** argv, int* exitCode);

// The same model without printing, for tests: throws ValueError with CLI11's or our message.
LaunchOptions parseArgs(const std::vector<std::string>& args);

// Every environment knob the runtime reads (the env registry), formatted for --help-env.
std::string helpEnvText();

}  // namespace cohort::launcher
