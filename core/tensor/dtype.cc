#include <cohort/core/tensor/dtype.h>

namespace cohort {

const char* dtypeName(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "unknown";
}

DType dtypeFromName(const std::string& n) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (n == dtypeName(static_cast<DType>(i))) return static_cast<DType>(i);
  if (n == "float" || n == "f32") return DType::Float32;
  if (n == "double" || n == "f64") return DType::Float64;
  if (n == "half" || n == "f16") return DType::Float16;
  if (n == "bf16") return DType::BFloat16;
  if (n == "long") return DType::Int64;
  if (n == "int") return DType::Int32;
  throw ValueError(fmt::format("'{}' is not a dtype (expected one of float32, float64, float16, bfloat16, int64, "
                               "int32, uint8, bool)",
                               n));
}

DType promoteTypes(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool: return 0;
      case DType::UInt8: return 1;
      case DType::Int32: return 2;
      case DType::Int64: return 3;
      case DType::Float16: return 4;
      case DType::BFloat16: return 4;
      case DType::Float32: return 5;
      case DType::Float64: return 6;
    }
    return 0;
  };
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace cohort
