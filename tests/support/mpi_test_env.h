#pragma once
// For test binaries built on mpi_test_main.cpp (tests/CMakeLists.txt: strata_add_mpi_test).
#include <memory>

#include "comm/communicator.h"

namespace strata::testing {

// The world the test main started with init_world("auto", cpu, timeout): MPI under mpirun, a
// world of one when the binary runs alone. The timeout is STRATA_TEST_COMM_TIMEOUT_S (default
// 60 s).
std::shared_ptr<comm::Communicator> test_world();

}  // namespace strata::testing
