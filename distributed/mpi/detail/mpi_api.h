// MPI's C API, the one way cohort includes <mpi.h>: the C++ bindings are switched off first
// (OpenMPI's need libmpi_cxx, which cohort does not link). Internal: no installed header
// includes MPI.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
