/*
 * How cohort's dtypes and reductions map onto MPI.
 *
 * Data movement uses the element's MPI type (float16/bfloat16 travel as MPI_UINT16_T, bool as
 * MPI_C_BOOL). Reductions:
 *  - float32, float64 and the integer types reduce in place in MPI with MPI_SUM/PROD/MIN/MAX;
 *    avg is a sum divided by the group size (floating types only, as ProcessGroup checks);
 *  - float16/bfloat16 are widened to float32 buffers, reduced there, and rounded once on the
 *    way back, so they accumulate in float32;
 *  - bool follows PyTorch: sum and max are logical or (MPI_LOR), product and min logical and
 *    (MPI_LAND); avg is refused. The result is always 0 or 1, never an out-of-range bool.
 * Called on backend threads; pure functions.
 */
#pragma once

#include <cohort/distributed/mpi/detail/mpi_api.h>

#include <cstdint>
#include <vector>

#include <cohort/core/tensor/dtype.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/distributed/collective_options.h>

namespace cohort::dist::mpi_backend {

// The MPI type an element of `t` travels as.
MPI_Datatype mpiType(DType t);
// True when reductions of `t` go through a float32 staging buffer.
inline bool reducesInFloat32(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
// The type reductions of `t` run in: MPI_FLOAT for float16/bfloat16, else mpiType(t).
MPI_Datatype mpiReduceType(DType t);
// The MPI op for `op` on `t` (bool: or/and; avg: sum, divided afterwards). Throws ValueError for
// avg on non-floating types.
MPI_Op mpiOp(ReduceOp op, DType t);

// float16/bfloat16 <-> float32 staging (n elements).
void widenToFloat(const void* src, DType t, float* dst, int64_t n);
void narrowFromFloat(const float* src, DType t, void* dst, int64_t n);
// Divides n elements of a float32/float64 buffer by `divisor` (the avg reduction's last step).
void divideInPlace(void* data, MPI_Datatype type, int64_t n, int divisor);

// An element count as MPI's int; DistError when it does not fit (MPI 3.1 counts are int).
int mpiCount(int64_t n, const char* what);

// The address of a tensor's first element, or nullptr for an empty tensor.
inline void* dataOrNull(const Tensor& t) { return t.numel() == 0 ? nullptr : t.dataPtr(); }

}  // namespace cohort::dist::mpi_backend
