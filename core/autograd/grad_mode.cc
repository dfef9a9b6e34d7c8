#include <cohort/core/autograd/grad_mode.h>

namespace cohort::autograd {
namespace {
thread_local bool tGradEnabled = true;
}
bool isGradEnabled() { return tGradEnabled; }
void setGradEnabled(bool enabled) { tGradEnabled = enabled; }
}  // namespace cohort::autograd
