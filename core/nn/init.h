/*
 * Parameter initialisers, PyTorch's torch.nn.init with the same formulas (fan computation,
 * gains, bounds). They fill in place, without autograd, drawing from `gen` (the default CPU
 * generator when null), so a model built after manualSeed(s) is the same on every run.
 * The numbers differ from PyTorch's (a different random stream); the distributions do not.
 */
#pragma once

#include <string>
#include <utility>

#include <cohort/core/tensor/generator.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::nn::init {

enum class FanMode { FanIn, FanOut };

// (fan_in, fan_out) of a weight: [out, in, k...] -> (in * prod(k), out * prod(k)); needs >= 2 dims.
std::pair<int64_t, int64_t> fanInAndFanOut(const Tensor& t);
// torch.nn.init.calculate_gain for "linear", "conv2d", "sigmoid", "tanh", "relu", "leaky_relu", "selu".
double calculateGain(const std::string& nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double stddev = 1.0, Generator* gen = nullptr);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
Tensor& constant_(Tensor& t, double value);
// U(-b, b) with b = gain * sqrt(3 / fan), gain = calculateGain(nonlinearity, a).
Tensor& kaimingUniform_(Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor& kaimingNormal_(Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor& xavierUniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
Tensor& xavierNormal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace cohort::nn::init
