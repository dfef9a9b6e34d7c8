/*
 * Intra-op parallelism: parallelFor(n, grain, fn) runs fn(begin, end) over [0, n) split into
 * chunks run at once by the calling thread and a process-wide pool of helper threads.
 *
 * - How many threads: intraOpThreads(), which is blas::numThreads() — one count, set by
 *   blas::setNumThreads(n) or the environment (OMP_NUM_THREADS; cohortrun sets it to 1 per
 *   worker), governs GEMM and the elementwise kernels alike, as torch.set_num_threads does.
 * - A range splits only into chunks of at least `grain` elements, so small tensors run inline
 *   and pay nothing.
 * - Never nested, never queued: a call from inside a chunk, or while another thread's call holds
 *   the pool, runs inline on its own thread (rank threads of one process calling kernels at once
 *   do not oversubscribe the cores, and no call waits behind another).
 * - The pool's threads sleep on a condition variable between calls; they are named
 *   "cohort-intraop". A forked child starts with no pool and makes its own on first use.
 * - If fn throws, the first exception is rethrown on the calling thread once every chunk is done.
 * - Results must not depend on the split: the elementwise kernels that use it compute each
 *   element independently, so the output is bit-identical for any thread count.
 */
#pragma once

#include <cstdint>

#include <cohort/core/util/function_ref.h>

namespace cohort {

int intraOpThreads();

void parallelFor(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace cohort
