#include "tensor/backend.h"

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cuda.h"

namespace strata::tensor {

namespace {
Backend* g_cuda_backend = nullptr;
}

void register_backend(DeviceType type, Backend* backend) {
  STRATA_CHECK(type == DeviceType::CUDA, "only the CUDA backend is registered at run time");
  g_cuda_backend = backend;
}

void Backend::cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                  int64_t classes, float grad, const Tensor& norm, Tensor& losses,
                                  Tensor& lse) {
  cross_entropy_forward(logits, targets, ignore_index, classes, losses, lse);
  // dloss = grad / m on every row: the division the unfused backward makes (div(g, m)).
  const Device d = logits.device();
  const int64_t n = logits.size(0);
  Tensor g = Tensor::empty({1}, DType::F32, d), q = Tensor::empty({1}, DType::F32, d);
  fill(g, grad);
  binary(BinaryOp::Div, g, norm.narrow(0, 0, 1), q);
  Tensor dloss = Tensor::empty({n}, DType::F32, d);
  copy(q.expand(Shape{n}), dloss);
  cross_entropy_backward(logits, targets, lse, dloss, ignore_index, classes, logits);
}

void Backend::scale_unless_equal(Tensor& x, const Tensor& g, float expected) {
  const float v = g.to(Device::cpu()).contiguous().data<float>()[0];
  if (v == expected) return;
  affine(x, v / expected, 0.f, x);
}

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu::CpuBackend::instance();
  // Note [CUDA backend registration]: the first use turns the backend on (or says why not).
  if (g_cuda_backend == nullptr) init_cuda(device.index);
  STRATA_CHECK(g_cuda_backend != nullptr, "init_cuda did not register a backend");
  return *g_cuda_backend;
}

}  // namespace strata::tensor
