#include "parallel/rank_sum.h"

#include <cstring>

#include "tensor/tensor.h"

namespace strata::parallel {

double sum_over_ranks(comm::Communicator& comm, double x, Device device) {
  const int n = comm.size();
  if (n == 1) return x;
  tensor::Tensor mine = tensor::Tensor::empty({1}, DType::I64);
  std::memcpy(mine.data_ptr(), &x, sizeof(double));
  tensor::Tensor all = tensor::Tensor::empty({n}, DType::I64, device);
  comm.allgather(mine.to(device), all)->wait();
  const tensor::Tensor host = all.to(Device::cpu());
  double sum = 0;
  for (int q = 0; q < n; ++q) {
    double v;
    std::memcpy(&v, host.data<int64_t>() + q, sizeof(double));
    sum += v;
  }
  return sum;
}

}  // namespace strata::parallel
