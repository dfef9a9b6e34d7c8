// The one header a training script includes: tensors, autograd, kernels and utilities.
#pragma once

#include <cohort/config.h>
#include <cohort/core/amp/autocast.h>
#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/autograd/checkpoint.h>
#include <cohort/core/autograd/engine.h>
#include <cohort/core/autograd/function.h>
#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/split_backward.h>
#include <cohort/core/blas/blas.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/functional.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/optim.h>
#include <cohort/core/profiler/profiler.h>
#include <cohort/core/tensor/generator.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/future.h>
#include <cohort/core/util/logging.h>
