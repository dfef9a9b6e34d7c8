#include <cohort/distributed/mpi/detail/mpi_datatype.h>

#include <climits>

#include <fmt/format.h>

#include <cohort/core/tensor/half.h>
#include <cohort/core/util/error.h>

namespace cohort::dist::mpi_backend {

MPI_Datatype mpiType(DType t) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Float16: return MPI_UINT16_T;
    case DType::BFloat16: return MPI_UINT16_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Bool: return MPI_C_BOOL;
  }
  throw ValueError(fmt::format("backend mpi: no MPI datatype for dtype {}", static_cast<int>(t)));
}

MPI_Datatype mpiReduceType(DType t) { return reducesInFloat32(t) ? MPI_FLOAT : mpiType(t); }

MPI_Op mpiOp(ReduceOp op, DType t) {
  if (t == DType::Bool) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Max: return MPI_LOR;
      case ReduceOp::Product:
      case ReduceOp::Min: return MPI_LAND;
      case ReduceOp::Avg: break;
    }
    throw ValueError("backend mpi: reduction avg is not defined for bool tensors");
  }
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Avg:
      if (!isFloating(t)) {
        throw ValueError(fmt::format("backend mpi: reduction avg needs a floating-point tensor, got {}", t));
      }
      return MPI_SUM;
  }
  throw ValueError(fmt::format("backend mpi: unknown reduction {}", static_cast<int>(op)));
}

void widenToFloat(const void* src, DType t, float* dst, int64_t n) {
  if (t == DType::Float16) {
    const Half* s = static_cast<const Half*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else if (t == DType::BFloat16) {
    const BFloat16* s = static_cast<const BFloat16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    throw ValueError(fmt::format("backend mpi: widenToFloat on {}", t));
  }
}

void narrowFromFloat(const float* src, DType t, void* dst, int64_t n) {
  if (t == DType::Float16) {
    Half* d = static_cast<Half*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = Half(src[i]);
  } else if (t == DType::BFloat16) {
    BFloat16* d = static_cast<BFloat16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = BFloat16(src[i]);
  } else {
    throw ValueError(fmt::format("backend mpi: narrowFromFloat to {}", t));
  }
}

void divideInPlace(void* data, MPI_Datatype type, int64_t n, int divisor) {
  if (type == MPI_FLOAT) {
    float* p = static_cast<float*>(data);
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else if (type == MPI_DOUBLE) {
    double* p = static_cast<double*>(data);
    const double d = static_cast<double>(divisor);
    for (int64_t i = 0; i < n; ++i) p[i] /= d;
  } else {
    throw ValueError("backend mpi: avg of a non-floating buffer");
  }
}

int mpiCount(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX) {
    throw DistError(
        fmt::format("backend mpi: {} has {} elements, more than MPI 3.1's int counts allow ({})", what, n, INT_MAX));
  }
  return static_cast<int>(n);
}

}  // namespace cohort::dist::mpi_backend
