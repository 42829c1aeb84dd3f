# Finds the Debian packages Strata builds against and checks their versions.
# Nothing is downloaded or vendored: a missing package is a configure error
# that names the apt package to install (see README.md, "Dependencies").

function(strata_require found pkg apt_name)
  if(NOT ${found})
    message(FATAL_ERROR "Strata needs ${pkg}: install it with `apt-get install ${apt_name}` "
                        "(or run tools/setup.sh)")
  endif()
endfunction()

find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)

find_package(fmt 9 CONFIG QUIET)
strata_require(fmt_FOUND fmt libfmt-dev)
find_package(spdlog 1.10 CONFIG QUIET)
strata_require(spdlog_FOUND spdlog libspdlog-dev)
find_package(yaml-cpp 0.7 CONFIG QUIET)
strata_require(yaml-cpp_FOUND yaml-cpp libyaml-cpp-dev)
find_package(Eigen3 3.4 CONFIG QUIET)
strata_require(Eigen3_FOUND Eigen3 libeigen3-dev)
find_package(nlohmann_json 3.10 CONFIG QUIET)
strata_require(nlohmann_json_FOUND nlohmann_json nlohmann-json3-dev)
find_package(CLI11 2.1 CONFIG QUIET)
strata_require(CLI11_FOUND CLI11 libcli11-dev)

# Asynchronous file I/O for the NVMe tier (offload/): io_uring through liburing, libaio as the
# fallback where io_uring is not allowed (seccomp'd containers).
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING QUIET IMPORTED_TARGET liburing)
strata_require(URING_FOUND liburing liburing-dev)
find_library(AIO_LIBRARY aio)
find_path(AIO_INCLUDE_DIR libaio.h)
if(AIO_LIBRARY AND AIO_INCLUDE_DIR)
  set(AIO_FOUND ON)
  add_library(strata_libaio INTERFACE IMPORTED)
  target_link_libraries(strata_libaio INTERFACE ${AIO_LIBRARY})
  target_include_directories(strata_libaio INTERFACE ${AIO_INCLUDE_DIR})
endif()
strata_require(AIO_FOUND libaio libaio-dev)

set(STRATA_HAVE_ONEDNN OFF)
if(STRATA_WITH_ONEDNN)
  # Debian's oneDNN is built with its OpenCL GPU runtime, and its CMake config does a REQUIRED
  # find_package(OpenCL): without ocl-icd-opencl-dev (only a Recommends of libdnnl-dev) it would
  # stop the whole configure. Look for OpenCL first and fall back to Eigen when it is missing.
  find_package(OpenCL QUIET)
  if(OpenCL_FOUND)
    find_package(dnnl CONFIG QUIET)
  endif()
  if(dnnl_FOUND)
    set(STRATA_HAVE_ONEDNN ON)
  else()
    message(STATUS "oneDNN not found (apt-get install libdnnl-dev ocl-icd-opencl-dev); CPU matmul uses Eigen")
  endif()
endif()

set(STRATA_HAVE_MPI OFF)
if(STRATA_WITH_MPI)
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(STRATA_HAVE_MPI ON)
  endif()
endif()

set(STRATA_HAVE_CUDA OFF)
# What CUDA code links for the runtime and for cuBLASLt: the toolkit's libraries, or the emulator.
set(STRATA_CUDA_RUNTIME CUDA::cudart)
set(STRATA_CUBLASLT CUDA::cublasLt)
if(STRATA_CUDA_EMULATION)
  # Note [CUDA emulator]: the toolkit's headers only; the .cu files become C++ (see
  # strata_emulate_cuda_sources below) and cuda_emu provides the runtime and cuBLASLt.
  find_package(CUDAToolkit REQUIRED)  # finds /usr/local/cuda without nvcc on PATH too
  set(STRATA_HAVE_CUDA ON)
  set(STRATA_CUDA_RUNTIME strata_cuda_emu)
  set(STRATA_CUBLASLT strata_cuda_emu)
elseif(STRATA_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(STRATA_HAVE_CUDA ON)
  endif()
endif()
# Note [CUDA build]: Ampere (sm_80) and Hopper (sm_90) by default; a GPU-machine build may narrow
# it (-DSTRATA_CUDA_ARCHS=90) to halve compile time. cuDNN (fused attention) is optional and is
# taken only from the CUDA toolkit or /usr/local — never from a pip wheel's nvidia/cudnn folder,
# whose version need not match the headers we compile against.
set(STRATA_HAVE_CUDNN OFF)
if(STRATA_HAVE_CUDA AND NOT STRATA_CUDA_EMULATION)
  set(STRATA_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures to build for")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${STRATA_CUDA_ARCHS})
  endif()
  enable_language(CUDA)
  # CMake 3.25 cannot ask nvcc for C++20, so the .cu files are C++17 and include no Strata
  # headers: they export plain launchers (tensor/cuda/kernels.h) that C++20 code calls.
  # Imported targets (fmt, spdlog...) carry -isystem /usr/include, which breaks nvcc's
  # #include_next <math.h> in libstdc++; marking it implicit makes CMake drop it.
  list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include
            NO_DEFAULT_PATH)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib
               /usr/lib/x86_64-linux-gnu NO_DEFAULT_PATH)
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(STRATA_HAVE_CUDNN ON)
    add_library(strata_cudnn INTERFACE IMPORTED)
    target_link_libraries(strata_cudnn INTERFACE ${CUDNN_LIBRARY})
    target_include_directories(strata_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  else()
    message(STATUS "cuDNN not found next to the CUDA toolkit; attention uses Strata's own kernel")
  endif()
elseif(STRATA_CUDA_EMULATION)
  # The emulator provides cuDNN's graph API (Note [Emulated cuDNN], cuda_emu/cudnn.cpp):
  # only the headers are needed.
  find_path(CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include
            NO_DEFAULT_PATH)
  if(CUDNN_INCLUDE_DIR)
    set(STRATA_HAVE_CUDNN ON)
  endif()
endif()
# The emulator also provides NCCL's collectives between the processes of an mpirun job (Note
# [Emulated NCCL], cuda_emu/nccl.cpp): only nccl.h is needed.
set(STRATA_EMULATED_NCCL OFF)
if(STRATA_CUDA_EMULATION)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(NCCL_INCLUDE_DIR)
    set(STRATA_EMULATED_NCCL ON)
  endif()
endif()

# Compiles every .cu source of `target` (the sources it has when called) as C++ for the emulator
# (Note [CUDA emulator]): C++17 as under nvcc (Note [CUDA build] above), the device header
# force-included, FMA contraction as nvcc's default where the host has FMA (below). Does
# nothing in the other builds, where nvcc compiles them.
# The GPU faults on any access that is not naturally aligned ("misaligned address": a 128-bit
# Pack load from an address that is not a multiple of 16, a float load from an odd bf16 offset);
# x86 does not. UBSan's alignment check makes the emulated kernels stop at such an access, naming
# the file, line and address, so a missing aligned16() test fails CI instead of the first GPU run.
# `bounds` stops an index past a fixed-size array: a __shared__ tile (static storage here, where
# an overrun would silently write the next variable, as it would the next tile on the GPU) or a
# per-thread register array. `shift` stops shifts by the width or more, which x86 and the GPU
# resolve differently (x86 masks the count, PTX clamps it).
# FMA contraction as nvcc does it by default (Note [Emulated FMA contraction] in
# cuda_emu/device.h), where the compiler and this host have FMA; off elsewhere.
option(STRATA_CUDA_EMU_FMA_CONTRACT
       "emulated kernels contract a*b+c into FMAs as nvcc does (needs a host CPU with FMA)" ON)
set(STRATA_EMULATED_CONTRACT "-ffp-contract=off")
if(STRATA_CUDA_EMULATION AND STRATA_CUDA_EMU_FMA_CONTRACT)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-mfma STRATA_COMPILER_HAS_MFMA)
  set(_host_fma OFF)
  if(EXISTS /proc/cpuinfo)
    file(STRINGS /proc/cpuinfo _flags REGEX "^flags" LIMIT_COUNT 1)
    if(_flags MATCHES " fma( |$)")
      set(_host_fma ON)
    endif()
  endif()
  if(STRATA_COMPILER_HAS_MFMA AND _host_fma)
    set(STRATA_EMULATED_CONTRACT "-ffp-contract=fast;-mfma")
    set(STRATA_CUDA_EMU_CONTRACTS ON)
  else()
    message(STATUS "CUDA emulator: no FMA on this host or compiler; kernels are not contracted")
  endif()
endif()
set(STRATA_EMULATED_CUDA_OPTIONS
    "-std=c++17;-include;${CMAKE_SOURCE_DIR}/cuda_emu/device.h;${STRATA_EMULATED_CONTRACT};-Wno-unknown-pragmas;-fsanitize=alignment,bounds,shift;-fno-sanitize-recover=alignment,bounds,shift")
if(STRATA_CUDA_EMULATION)
  add_link_options(-fsanitize=alignment,bounds,shift)  # the UBSan runtime for the emulated kernels
endif()
# NO_CONTRACT (after the target): the target's .cu files are built with nvcc's --fmad=false, so
# the emulator does not contract them either.
function(strata_emulate_cuda_sources target)
  if(STRATA_CUDA_EMULATION)
    get_target_property(srcs ${target} SOURCES)
    list(FILTER srcs INCLUDE REGEX "\\.cu$")
    set(opts "${STRATA_EMULATED_CUDA_OPTIONS}")
    if("NO_CONTRACT" IN_LIST ARGN)
      list(APPEND opts -ffp-contract=off)
    endif()
    set_source_files_properties(${srcs} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "${opts}")
  endif()
endfunction()

if(STRATA_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  strata_require(GTest_FOUND GoogleTest "libgtest-dev libgmock-dev")
endif()
if(STRATA_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
  strata_require(benchmark_FOUND "Google Benchmark" libbenchmark-dev)
endif()
