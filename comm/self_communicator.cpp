#include "comm/self_communicator.h"

#include "core/error.h"
#include "comm/comm_common.h"

namespace strata::comm {

namespace {
// Self accepts tensors on any device: a size-1 group of a GPU run is a SelfCommunicator too.
constexpr bool kAnyDevice = true;

WorkHandle done() {
  return std::make_shared<detail::DoneWork>();
}
}  // namespace

WorkHandle SelfCommunicator::allreduce(tensor::Tensor t, ReduceOp) {
  detail::check_tensor(*this, "allreduce", "tensor", t, kAnyDevice);
  detail::check_reducible(*this, "allreduce", t, /*allow_half=*/true);
  return done();
}

WorkHandle SelfCommunicator::reduce_scatter(tensor::Tensor input, tensor::Tensor output, ReduceOp) {
  detail::check_tensor(*this, "reduce_scatter", "input tensor", input, kAnyDevice);
  detail::check_tensor(*this, "reduce_scatter", "output tensor", output, kAnyDevice);
  detail::check_reducible(*this, "reduce_scatter", input, /*allow_half=*/true);
  detail::check_scatter_shapes(*this, "reduce_scatter", input, output);
  if (!detail::is_chunk_of(output, input, 0)) output.copy_(input.view(output.shape()));
  return done();
}

WorkHandle SelfCommunicator::allgather(tensor::Tensor input, tensor::Tensor output) {
  detail::check_tensor(*this, "allgather", "input tensor", input, kAnyDevice);
  detail::check_tensor(*this, "allgather", "output tensor", output, kAnyDevice);
  detail::check_scatter_shapes(*this, "allgather", output, input);
  if (!detail::is_chunk_of(input, output, 0)) output.copy_(input.view(output.shape()));
  return done();
}

WorkHandle SelfCommunicator::broadcast(tensor::Tensor t, int root) {
  detail::check_tensor(*this, "broadcast", "tensor", t, kAnyDevice);
  detail::check_root(*this, root);
  return done();
}

WorkHandle SelfCommunicator::send(tensor::Tensor t, int peer, int tag) {
  detail::check_tensor(*this, "send", "tensor", t, kAnyDevice);
  detail::check_peer(*this, "send", peer, tag);
  STRATA_UNREACHABLE("check_peer accepts no peer in a group of one");
}

WorkHandle SelfCommunicator::recv(tensor::Tensor t, int peer, int tag) {
  detail::check_tensor(*this, "recv", "tensor", t, kAnyDevice);
  detail::check_peer(*this, "recv", peer, tag);
  STRATA_UNREACHABLE("check_peer accepts no peer in a group of one");
}

std::unique_ptr<Communicator> SelfCommunicator::split(int color, int, std::string name) {
  if (color < 0) return nullptr;
  return std::make_unique<SelfCommunicator>(std::move(name));
}

}  // namespace strata::comm
