#include <cohort/core/util/cpu_affinity.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::util {

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0)
    throw Error(fmt::format("allowedCpus: sched_getaffinity failed: {}", std::strerror(errno)));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<int> cpuSlice(const std::vector<int>& cpus, int localRank, int localSize) {
  if (localSize < 1)
    throw ValueError(fmt::format("cpuSlice: the local world size must be at least 1, got {}", localSize));
  if (localRank < 0 || localRank >= localSize)
    throw ValueError(fmt::format("cpuSlice: local rank {} is outside [0, {})", localRank, localSize));
  if (cpus.empty()) throw ValueError("cpuSlice: no CPUs to share out");
  const int n = static_cast<int>(cpus.size());
  if (n < localSize) return {cpus[localRank % n]};
  const int base = n / localSize, extra = n % localSize;
  const int begin = localRank * base + std::min(localRank, extra);
  const int count = base + (localRank < extra ? 1 : 0);
  return {cpus.begin() + begin, cpus.begin() + begin + count};
}

cpu_set_t cpuSet(const std::vector<int>& cpus) {
  if (cpus.empty()) throw ValueError("cpuSet: no CPUs given");
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE) throw ValueError(fmt::format("cpuSet: CPU {} is outside [0, {})", c, CPU_SETSIZE));
    CPU_SET(c, &set);
  }
  return set;
}

void bindToCpus(const std::vector<int>& cpus) {
  const cpu_set_t set = cpuSet(cpus);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0)
    throw Error(fmt::format("bindToCpus: the kernel refused CPUs {}: {}", cpuListString(cpus), std::strerror(errno)));
}

std::string cpuListString(const std::vector<int>& cpus) {
  std::vector<int> s = cpus;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    while (j + 1 < s.size() && s[j + 1] == s[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", s[i]) : fmt::format("{}-{}", s[i], s[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace cohort::util
