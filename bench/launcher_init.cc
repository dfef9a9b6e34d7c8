// Worker for scripts/bench_launcher.sh: joins the job with dist::initProcessGroup() and prints
// the wall-clock time (CLOCK_REALTIME, ns) at which it got through, so the script can measure
// launcher start -> every worker initialised. Runs under cohortrun, torchrun --no-python or mpirun.
#include <time.h>

#include <cstdio>

#include <cohort/distributed/init.h>

int main() {
  auto pg = cohort::dist::initProcessGroup();
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  std::printf("init_done_ns %lld rank %d of %d\n", static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec,
              pg->rank(), pg->size());
  std::fflush(stdout);
  cohort::dist::destroyProcessGroup();
  return 0;
}
