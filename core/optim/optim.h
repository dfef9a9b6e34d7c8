// The optim layer in one include: optimizers, learning-rate schedules and gradient clipping.
#pragma once

#include <cohort/core/optim/adam.h>
#include <cohort/core/optim/clip_grad.h>
#include <cohort/core/optim/factory.h>
#include <cohort/core/optim/lr_scheduler.h>
#include <cohort/core/optim/optimizer.h>
#include <cohort/core/optim/sgd.h>
