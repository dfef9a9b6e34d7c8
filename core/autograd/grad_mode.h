/*
 * Grad mode: whether ops record history. Thread-local, on by default; NoGradGuard turns it off
 * for a scope (optimizer steps, evaluation, the backward pass itself).
 */
#pragma once

namespace cohort::autograd {

bool isGradEnabled();
void setGradEnabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(isGradEnabled()) { setGradEnabled(false); }
  ~NoGradGuard() { setGradEnabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class EnableGradGuard {
 public:
  explicit EnableGradGuard(bool enabled = true) : prev_(isGradEnabled()) { setGradEnabled(enabled); }
  ~EnableGradGuard() { setGradEnabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace cohort::autograd
