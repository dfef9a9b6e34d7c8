# Finds cohort's dependencies and resolves the COHORT_USE_* options.
# Each COHORT_USE_<X> is AUTO (the default: on when found), ON (missing is a configure error)
# or OFF. After this file runs, COHORT_USE_<X> is 0 or 1 for config.h.
find_package(Threads REQUIRED)
# fmt is used header-only (FMT_HEADER_ONLY) and is part of cohort's public headers.
find_package(fmt REQUIRED)
include(CheckSymbolExists)
include(CheckLanguage)

macro(cohort_option name doc)
  set(COHORT_USE_${name} AUTO CACHE STRING "${doc} (AUTO, ON or OFF)")
  set_property(CACHE COHORT_USE_${name} PROPERTY STRINGS AUTO ON OFF)
endmacro()

# cohort_resolve(NAME found-variable what-was-looked-for)
macro(cohort_resolve name found what)
  string(TOUPPER "${COHORT_USE_${name}}" _req)
  if(_req STREQUAL "OFF" OR _req STREQUAL "0" OR _req STREQUAL "FALSE" OR _req STREQUAL "NO")
    set(COHORT_USE_${name} 0)
  elseif(${found})
    set(COHORT_USE_${name} 1)
  elseif(_req STREQUAL "AUTO")
    set(COHORT_USE_${name} 0)
  else()
    message(FATAL_ERROR "COHORT_USE_${name}=${_req} was asked for, but ${what} was not found. "
                        "Run ./scripts/setup.sh, or configure with -DCOHORT_USE_${name}=OFF.")
  endif()
  message(STATUS "cohort: COHORT_USE_${name} = ${COHORT_USE_${name}}")
endmacro()

cohort_option(GLOO "Build the gloo collective backend")
cohort_option(MPI "Build the MPI collective backend")
cohort_option(SHM "Build the shared-memory collective backend")
cohort_option(TENSORPIPE "Build the TensorPipe RPC agent")
cohort_option(CUDA "Build CUDA device support")
cohort_option(NCCL "Build the NCCL collective backend")

# BLAS: cohort loads OpenBLAS itself at first use (core/blas/blas.cc explains why), so it needs
# only the cblas header at build time.
find_path(COHORT_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/x86_64-linux-gnu)
if(NOT COHORT_CBLAS_INCLUDE)
  message(FATAL_ERROR "cblas.h not found: run ./scripts/setup.sh (Debian package libopenblas-dev)")
endif()

if(NOT COHORT_USE_GLOO STREQUAL "OFF")
  find_package(Gloo QUIET)
endif()
cohort_resolve(GLOO Gloo_FOUND "gloo (Debian package libgloo-dev)")

if(NOT COHORT_USE_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS C)
endif()
cohort_resolve(MPI MPI_C_FOUND "MPI (Debian packages libopenmpi-dev openmpi-bin)")

check_symbol_exists(shm_open "sys/mman.h" COHORT_HAVE_SHM_OPEN)
cohort_resolve(SHM COHORT_HAVE_SHM_OPEN "POSIX shm_open")

set(COHORT_TENSORPIPE_TARGETS /usr/share/cmake/Tensorpipe/TensorpipeTargets.cmake)
set(COHORT_HAVE_TENSORPIPE FALSE)
if(NOT COHORT_USE_TENSORPIPE STREQUAL "OFF" AND EXISTS ${COHORT_TENSORPIPE_TARGETS})
  set(COHORT_HAVE_TENSORPIPE TRUE)
endif()
cohort_resolve(TENSORPIPE COHORT_HAVE_TENSORPIPE "TensorPipe (Debian package libtensorpipe-dev)")

set(COHORT_HAVE_CUDA FALSE)
if(NOT COHORT_USE_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(COHORT_HAVE_CUDA TRUE)
  endif()
endif()
cohort_resolve(CUDA COHORT_HAVE_CUDA "the CUDA toolkit")
if(COHORT_USE_CUDA)
  # Kernels (core/cuda/*.cu) are compiled by the toolkit's nvcc. Without an explicit
  # CMAKE_CUDA_ARCHITECTURES, code is built for Ampere (sm_80) and Hopper (sm_90), with PTX for
  # newer GPUs; set it (e.g. -DCMAKE_CUDA_ARCHITECTURES=native) to build for other cards.
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 dialect for nvcc 13 (cohort_core's cxx_std_20 applies to its CUDA
  # sources too); nvcc has -std=c++20 since 12.0.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
endif()

set(COHORT_HAVE_NCCL FALSE)
if(COHORT_USE_CUDA AND NOT COHORT_USE_NCCL STREQUAL "OFF")
  find_path(COHORT_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(COHORT_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(COHORT_NCCL_INCLUDE AND COHORT_NCCL_LIB)
    set(COHORT_HAVE_NCCL TRUE)
  endif()
endif()
cohort_resolve(NCCL COHORT_HAVE_NCCL "NCCL (nccl.h and libnccl, with CUDA)")
