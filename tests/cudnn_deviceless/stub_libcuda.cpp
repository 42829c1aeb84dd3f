// A stand-in CUDA driver (libcuda.so.1) for building cuDNN plans on a machine without a GPU
// (Note [Deviceless cuDNN plans] in tensor/cuda/sdpa_plan.h).
//
// cuDNN's runtime-compiled engines refuse to work ("cannot load libcuda") unless they can open
// libcuda.so.1 and resolve the driver functions they use, even when the plan is built for a
// device-properties descriptor and nothing will run. This library gives them those names:
//   - cuDriverGetVersion reports CUDA 13.0;
//   - cuLibraryLoadData and cuLibraryGetKernel accept the compiled kernel and hand back a
//     placeholder (the plan's last step loads the kernel it compiled), recording the kernel's
//     name for the tests (strata_stub_libcuda_kernels);
//   - cuLibraryUnload, cuGetErrorString and cuGetErrorName do what they say;
//   - everything else returns CUDA_ERROR_NO_DEVICE, which is the truth here.
// Nothing can run through it. Only tests/cudnn_deviceless loads it, by its path; it is never on
// a loader path, so no other process can pick it up instead of a real driver.
#include <mutex>
#include <string>

namespace {

constexpr int kSuccess = 0;     // CUDA_SUCCESS
constexpr int kNoDevice = 100;  // CUDA_ERROR_NO_DEVICE
constexpr int kDriver = 13000;  // CUDA 13.0, the toolkit Strata builds with
constexpr int kNotFound = 500;  // CUDA_ERROR_NOT_FOUND

std::mutex g_mu;
std::string g_kernels;  // one name per line, in the order asked for
int g_images = 0;
int g_placeholder = 0;  // its address stands for every library and kernel handed out

}  // namespace

extern "C" {

// ---- for the tests ----
const char* strata_stub_libcuda_kernels() {
  std::lock_guard<std::mutex> lock(g_mu);
  static thread_local std::string copy;
  copy = g_kernels;
  return copy.c_str();
}
int strata_stub_libcuda_images() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_images;
}

// ---- what a plan's finalization calls ----
int cuDriverGetVersion(int* version) {
  if (!version) return 1;  // CUDA_ERROR_INVALID_VALUE
  *version = kDriver;
  return kSuccess;
}
int cuLibraryLoadData(void** library, const void* code, void*, void*, unsigned, void*, void*,
                      unsigned) {
  if (!library || !code) return 1;
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_images;
  *library = &g_placeholder;
  return kSuccess;
}
int cuLibraryGetKernel(void** kernel, void* library, const char* name) {
  if (!kernel || library != &g_placeholder || !name) return kNotFound;
  std::lock_guard<std::mutex> lock(g_mu);
  g_kernels += name;
  g_kernels += '\n';
  *kernel = &g_placeholder;
  return kSuccess;
}
int cuLibraryUnload(void*) {
  return kSuccess;
}
int cuGetErrorString(int error, const char** text) {
  if (!text) return 1;
  *text = error == kNoDevice ? "no CUDA device (Strata's stand-in driver: nothing runs here)"
                             : "error from Strata's stand-in driver";
  return kSuccess;
}
int cuGetErrorName(int error, const char** text) {
  if (!text) return 1;
  *text = error == kNoDevice ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return kSuccess;
}

// ---- the rest of what cuDNN 9.12 to 9.26 resolve: no device ----
#define STRATA_NO_DEVICE(name) \
  int name() {                 \
    return kNoDevice;          \
  }
STRATA_NO_DEVICE(cuInit)
STRATA_NO_DEVICE(cuDeviceGet)
STRATA_NO_DEVICE(cuDeviceGetCount)
STRATA_NO_DEVICE(cuDeviceGetAttribute)
STRATA_NO_DEVICE(cuDevicePrimaryCtxRetain)
STRATA_NO_DEVICE(cuDevicePrimaryCtxRelease)
STRATA_NO_DEVICE(cuDevicePrimaryCtxReset)
STRATA_NO_DEVICE(cuCtxGetCurrent)
STRATA_NO_DEVICE(cuCtxGetDevice)
STRATA_NO_DEVICE(cuCtxGetLimit)
STRATA_NO_DEVICE(cuCtxPushCurrent)
STRATA_NO_DEVICE(cuCtxPopCurrent)
STRATA_NO_DEVICE(cuStreamGetCtx)
STRATA_NO_DEVICE(cuStreamSynchronize)
STRATA_NO_DEVICE(cuFuncGetAttribute)
STRATA_NO_DEVICE(cuFuncSetAttribute)
STRATA_NO_DEVICE(cuKernelGetAttribute)
STRATA_NO_DEVICE(cuKernelSetAttribute)
STRATA_NO_DEVICE(cuLaunchKernel)
STRATA_NO_DEVICE(cuLaunchKernelEx)
STRATA_NO_DEVICE(cuLaunchCooperativeKernel)
STRATA_NO_DEVICE(cuLibraryLoadFromFile)
STRATA_NO_DEVICE(cuLinkCreate)
STRATA_NO_DEVICE(cuLinkCreate_v2)
STRATA_NO_DEVICE(cuLinkAddData)
STRATA_NO_DEVICE(cuLinkAddData_v2)
STRATA_NO_DEVICE(cuLinkAddFile_v2)
STRATA_NO_DEVICE(cuLinkComplete)
STRATA_NO_DEVICE(cuLinkDestroy)
STRATA_NO_DEVICE(cuMemcpyDtoH_v2)
STRATA_NO_DEVICE(cuModuleLoadData)
STRATA_NO_DEVICE(cuModuleLoadDataEx)
STRATA_NO_DEVICE(cuModuleLoadFatBinary)
STRATA_NO_DEVICE(cuModuleGetFunction)
STRATA_NO_DEVICE(cuModuleGetGlobal_v2)
STRATA_NO_DEVICE(cuModuleUnload)
STRATA_NO_DEVICE(cuOccupancyMaxActiveBlocksPerMultiprocessor)
STRATA_NO_DEVICE(cuOccupancyMaxPotentialClusterSize)
STRATA_NO_DEVICE(cuTensorMapEncodeTiled)
#undef STRATA_NO_DEVICE

}  // extern "C"
