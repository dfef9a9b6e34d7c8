// The one header a distributed training script adds: joining the job, process groups and their
// collectives, DistributedDataParallel with its comm hooks and Join, and the found-inf reduction
// that keeps an amp::GradScaler's skipped steps the same on every rank.
#pragma once

#include <cohort/distributed/ddp/comm_hook.h>
#include <cohort/distributed/ddp/distributed_data_parallel.h>
#include <cohort/distributed/ddp/join.h>
#include <cohort/distributed/device_mesh.h>
#include <cohort/distributed/grad_scaler.h>
#include <cohort/distributed/init.h>
#include <cohort/distributed/job_profile.h>
#include <cohort/distributed/process_group.h>
