// The nn layer in one include: modules, layers, containers, attention and transformer encoder
// modules, the GPT model, initialisers and the functional ops they are built on.
#pragma once

#include <cohort/core/nn/attention.h>
#include <cohort/core/nn/container.h>
#include <cohort/core/nn/init.h>
#include <cohort/core/nn/layers.h>
#include <cohort/core/nn/module.h>
#include <cohort/core/nn/transformer.h>
#include <cohort/core/ops/functional.h>
