// Differentiable collectives (Note [Tensor-parallel regions]): forward and backward side by side.
#include "autograd/comm_functions.h"

#include <vector>

#include "autograd/hooks.h"
#include "autograd/node.h"
#include "tensor/ops.h"

namespace strata::autograd {

namespace {

bool trivial(const TpGroup& group) {
  return group == nullptr || group->size() == 1;
}

// A fresh contiguous copy unless `t` is contiguous and nothing else holds its storage (then `t`
// itself): a buffer a collective may overwrite in place.
Tensor owned_buffer(const Tensor& t) {
  if (t.is_contiguous() && t.storage().use_count() == 1 && t.offset() == 0 &&
      t.nbytes() == t.storage()->nbytes())
    return t;
  return t.clone();
}

Tensor allreduce(Tensor t, comm::Communicator& group) {
  group.allreduce(t, comm::ReduceOp::Sum)->wait();
  return t;
}

// x [..., T / tp, ...] (dim 1 scaled by `factor`).
Shape scale_dim1(const Shape& s, int64_t num, int64_t den) {
  STRATA_CHECK(s.ndim() >= 2 && (s[1] * num) % den == 0,
               "sequence-parallel tensors are [B, T, ...]; got a shape of {} dims", s.ndim());
  Shape out = s;
  out[1] = s[1] * num / den;
  return out;
}

// All-gather of [..., Cl] pieces into [..., tp * Cl], rank r's columns at r * Cl.
Tensor gather_last_dim(const Tensor& x, comm::Communicator& group) {
  const int tp = group.size();
  Tensor in = x.contiguous();
  Shape parts_shape{tp};
  for (int d = 0; d < in.ndim(); ++d) parts_shape.push_back(in.size(d));
  Tensor parts = Tensor::empty(parts_shape, in.dtype(), in.device());
  group.allgather(in, parts)->wait();
  // [tp, ..., Cl] -> [..., tp, Cl]: the one reordering copy a last-dim gather needs.
  std::vector<int> perm;
  for (int d = 1; d < in.ndim(); ++d) perm.push_back(d);
  perm.push_back(0);
  perm.push_back(in.ndim());
  Shape out_shape = in.shape();
  out_shape[out_shape.ndim() - 1] = in.size(-1) * tp;
  return parts.permute(perm).contiguous().view(out_shape);
}

Tensor own_columns(const Tensor& x, const comm::Communicator& group) {
  const int64_t c = x.size(-1);
  STRATA_CHECK(c % group.size() == 0, "last dim {} of {} does not split over tp = {}", c, x.str(),
               group.size());
  const int64_t cl = c / group.size();
  return x.narrow(x.ndim() - 1, group.rank() * cl, cl).contiguous();
}

}  // namespace

int tp_size(const TpGroup& group) {
  return group ? group->size() : 1;
}

int tp_rank(const TpGroup& group) {
  return group ? group->rank() : 0;
}

Variable copy_to_tp_region(const Variable& x, const TpGroup& group) {
  if (trivial(group)) return x;
  TpGroup g = group;
  // The incoming gradient may be shared with another branch (a residual add hands one tensor to
  // both): reduce a copy.
  return make_output("CopyToTpRegion", x.data(), {x}, [g](const std::vector<Tensor>& gs) {
    return std::vector<Tensor>{allreduce(gs[0].clone(), *g)};
  });
}

Variable reduce_from_tp_region(const Variable& x, const TpGroup& group) {
  if (trivial(group)) return x;
  Tensor y = allreduce(owned_buffer(x.data()), *group);
  return make_output("ReduceFromTpRegion", y, {x},
                     [](const std::vector<Tensor>& gs) { return std::vector<Tensor>{gs[0]}; });
}

Variable gather_from_tp_region(const Variable& x, const TpGroup& group) {
  if (trivial(group)) return x;
  TpGroup g = group;
  return make_output(
      "GatherFromTpRegion", gather_last_dim(x.data(), *group), {x},
      [g](const std::vector<Tensor>& gs) { return std::vector<Tensor>{own_columns(gs[0], *g)}; });
}

Variable scatter_to_tp_region(const Variable& x, const TpGroup& group) {
  if (trivial(group)) return x;
  TpGroup g = group;
  return make_output("ScatterToTpRegion", own_columns(x.data(), *group), {x},
                     [g](const std::vector<Tensor>& gs) {
                       return std::vector<Tensor>{gather_last_dim(gs[0], *g)};
                     });
}

Variable gather_from_sequence_region(const Variable& x, const TpGroup& group) {
  if (trivial(group)) return x;
  const int tp = group->size();
  Tensor in = x.data().contiguous();
  Tensor out = Tensor::empty(scale_dim1(in.shape(), tp, 1), in.dtype(), in.device());
  group->allgather(in, out)->wait();
  TpGroup g = group;
  const Shape local = in.shape();
  return make_output("GatherFromSequenceRegion", out, {x},
                     [g, local](const std::vector<Tensor>& gs) {
                       Tensor d = Tensor::empty(local, gs[0].dtype(), gs[0].device());
                       g->reduce_scatter(gs[0].contiguous(), d, comm::ReduceOp::Sum)->wait();
                       return std::vector<Tensor>{d};
                     });
}

Variable reduce_scatter_to_sequence_region(const Variable& x, const TpGroup& group) {
  if (trivial(group)) return x;
  const int tp = group->size();
  Tensor in = x.data().contiguous();
  STRATA_CHECK(in.ndim() >= 2 && in.size(1) % tp == 0,
               "reduce_scatter_to_sequence_region: {} has no sequence dim divisible by tp = {}",
               in.str(), tp);
  Tensor out = Tensor::empty(scale_dim1(in.shape(), 1, tp), in.dtype(), in.device());
  group->reduce_scatter(in, out, comm::ReduceOp::Sum)->wait();
  TpGroup g = group;
  const Shape full = in.shape();
  return make_output("ReduceScatterToSequenceRegion", out, {x},
                     [g, full](const std::vector<Tensor>& gs) {
                       Tensor d = Tensor::empty(full, gs[0].dtype(), gs[0].device());
                       g->allgather(gs[0].contiguous(), d)->wait();
                       return std::vector<Tensor>{d};
                     });
}

std::vector<Variable> with_gathered_sequence(const Variable& x, const TpGroup& group,
                                             const GatheredConsumers& consumers) {
  if (trivial(group)) return consumers(x);
  const Variable gathered = gather_from_sequence_region(x, group);
  std::vector<Variable> outs = consumers(gathered);
  if (!GradMode::is_enabled()) return outs;
  Tensor full = gathered.data();
  std::shared_ptr<tensor::Storage> storage = full.storage();
  bool graph = false;
  for (const Variable& o : outs) {
    graph = graph || o.requires_grad();
    // An output viewing the gathered bytes (an identity consumer) must keep them.
    if (o.data().defined() && o.data().storage() == storage) return outs;
  }
  if (!graph) return outs;
  const Tensor local = x.data().contiguous();
  storage->release();
  TpGroup g = group;
  // Mutable: the callback drops its view once the storage holds the gathered bits again, so the
  // bytes go when the consumers' nodes have run.
  return on_backward(outs, [g, local, full]() mutable {
    full.storage()->materialize();
    g->allgather(local, full)->wait();
    full = Tensor();
  });
}

Tensor sequence_shard(const Tensor& full, const TpGroup& group) {
  if (trivial(group)) return full;
  const int tp = group->size();
  Tensor c = full.contiguous();
  Shape local = scale_dim1(c.shape(), 1, tp);
  STRATA_CHECK(c.size(1) % tp == 0, "sequence {} does not split over tp = {}", c.size(1), tp);
  return c.view({tp, -1}).select(0, group->rank()).view(local);
}

Tensor sequence_positions(int64_t batch, int64_t seq, int64_t start, const TpGroup& group,
                          Device device) {
  const int tp = tp_size(group), r = tp_rank(group);
  STRATA_CHECK(seq % tp == 0, "sequence {} does not split over tp = {}", seq, tp);
  const int64_t n = batch * seq / tp, first = r * n;
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) pos[static_cast<size_t>(j)] = start + (first + j) % seq;
  Tensor t = tensor::from_ints(pos, {batch, seq / tp});
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace strata::autograd
