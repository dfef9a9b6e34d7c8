/*
 * FakeBackend: the communicator backend (comm_backend.h) over the in-process FakeCommunicator
 * (fake_communicator.h), registered as "fake" in every build. It serves CPU tensors for ranks
 * that are threads of one process (they find each other's communicators through an id rank 0
 * publishes in the group's store), and runs exactly the watchdog and backend code the NCCL
 * backend runs, so timeouts, asynchronous errors, aborts and their diagnosis are tested without
 * a GPU. Not for training: every op copies its data through the shared world.
 *
 * Faults are set per group name before the group is created: setFakeCommOptions("g", {...})
 * makes every "fake" backend of a group named "g" created afterwards inject them.
 */
#pragma once

#include <memory>
#include <string>

#include <cohort/distributed/watchdog/comm_backend.h>
#include <cohort/distributed/watchdog/fake_communicator.h>

namespace cohort::dist {

void setFakeCommOptions(const std::string& group, FakeCommOptions opts);
void clearFakeCommOptions(const std::string& group);

class FakeBackend : public CommBackend {
 public:
  FakeBackend(const StorePtr& store, int rank, int size, const BackendOptions& opts);
  ~FakeBackend() override;

  bool supportsDevice(DeviceType type) const override { return type == DeviceType::CPU; }
  FakeCommunicator& communicator() { return *comm_; }

 protected:
  Target prepare(Device device) override;
  void* address(const Tensor& t) const override { return t.dataPtr(); }
  Tensor barrierTensor() override { return barrier_; }

 private:
  std::shared_ptr<FakeCommunicator> comm_;
  Tensor barrier_;
};

}  // namespace cohort::dist
