// cohortrun: launches and supervises the workers of a cohort job on this node (see node_supervisor.h).
//   cohortrun --standalone --nproc-per-node 2 ./train
//   cohortrun --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 --nproc-per-node 8 ./train
#include <cohort/launcher/node_supervisor.h>
#include <cohort/launcher/options.h>

int main(int argc, char** argv) {
  int code = 0;
  auto options = cohort::launcher::parseCommandLine(argc, argv, &code);
  if (!options) return code;
  return cohort::launcher::superviseNode(*options);
}
