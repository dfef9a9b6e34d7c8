/*
 * Optimizers by name: what a remote worker is told to build (rpc::DistributedOptimizer) is a type
 * name and a map of options, not a C++ object.
 *
 *   auto opt = optim::makeOptimizer("AdamW", params, {{"lr", 3e-4}, {"weight_decay", 0.1}});
 *   optim::registerOptimizer("MySGD", [](std::vector<optim::ParamGroup> groups) {
 *     return std::make_unique<MySGD>(std::move(groups));
 *   });
 *
 * Built in: "SGD", "Adam", "AdamW", with torch's option names ("lr", "momentum", "weight_decay",
 * "beta1", ...); options not given keep the type's defaults. An unknown type (the message lists the
 * known ones) or option name is a ValueError.
 *
 * Threads: registration and lookup are thread-safe.
 */
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cohort/core/optim/optimizer.h>

namespace cohort::optim {

// Gets the parameter groups, each group's options being overrides of the type's defaults.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup> groups)>;

std::unique_ptr<Optimizer> makeOptimizer(const std::string& type, std::vector<Tensor> params,
                                         const GroupOptions& options = {});
std::unique_ptr<Optimizer> makeOptimizer(const std::string& type, std::vector<ParamGroup> groups);
// Registers (or replaces) a type. ValueError for an empty name or factory.
void registerOptimizer(const std::string& type, OptimizerFactory factory);
std::vector<std::string> optimizerTypes();

}  // namespace cohort::optim
