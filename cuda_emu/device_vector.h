#pragma once
// A device buffer for the emulator's own tests (compiled like .cu files, device.h included).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

namespace strata::cuda_emu {

// Device buffers of T, filled from and read back to the host.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n, T fill = T{}) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess);
    std::vector<T> h(n, fill);
    EXPECT_EQ(cudaMemcpy(p_, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceVector(const std::vector<T>& h) : n_(h.size()) {
    EXPECT_EQ(cudaMalloc(&p_, n_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVector() { cudaFree(p_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

}  // namespace strata::cuda_emu
