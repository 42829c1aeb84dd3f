#pragma once
// Differentiable collectives over a tensor-parallel group: Megatron's mappings (Shoeybi et al.
// 2019, Korthikanti et al. 2022), each with its backward beside it (Note [Forward and backward side
// by side]). Model code reaches them through the tensor-parallel layers (models/nn/
// parallel_linear.h, vocab_parallel_embedding.h), rarely directly.
//
// Note [Tensor-parallel regions]
// A column-parallel linear takes a replicated input and gives each rank its slice of the output
// features; a row-parallel linear takes that slice and gives each rank a partial sum of the
// output. The mappings join them:
//   copy_to_tp_region        forward identity          backward all-reduce
//   reduce_from_tp_region    forward all-reduce        backward identity
//   gather_from_tp_region    forward all-gather (last dim)  backward keep own slice
//   scatter_to_tp_region     forward keep own slice    backward all-gather (last dim)
// and, under sequence parallelism (Note [Sequence-parallel layout]), where the replicated regions
// hold 1/tp of the tokens instead:
//   gather_from_sequence_region       forward all-gather (tokens)   backward reduce-scatter
//   reduce_scatter_to_sequence_region forward reduce-scatter        backward all-gather
// A null group or a group of one makes every mapping the identity (the same Variable back, no
// node), so a tp = 1 model builds the graph and computes the bits of a model without them.
// Collectives run on contiguous buffers in the communicator's fixed order, so results are the
// same bits on every run (docs/design.md decision 9). Each mapping waits for its collective
// before it returns (forward) or hands its gradient on (backward): on the NCCL backend the
// collective runs on the communicator's own stream after an event recorded on the compute stream,
// and wait() blocks the host on its completion event (Note [NCCL streams] in
// comm/nccl_communicator.h); letting the compute stream wait on that event instead of the host is a
// Work API this layer does not have yet.
//
// Note [Sequence-parallel layout]
// Activations are [B, T, ...] with T the sequence. In a sequence-parallel region rank r holds
// tokens [r N / tp, (r + 1) N / tp) of the flattened token order (N = B * T), viewed as
// [B, T / tp, ...] (T % tp == 0): the rank-ordered concatenation of the ranks' buffers is the
// full [B, T, ...] tensor in memory, so the all-gather and the reduce-scatter work on whole
// contiguous buffers with no reordering copy (Megatron gets the same from its [T, B, ...] layout).
// The local rows are not "batch b, positions t..": only token-wise work (norms, residual adds,
// dropout, biases) happens there. Position-dependent inputs (GPT-2's wpe) use
// sequence_positions() to know which positions a rank holds.
#include <functional>
#include <memory>
#include <vector>

#include "autograd/variable.h"
#include "comm/communicator.h"

namespace strata::autograd {

using TpGroup = std::shared_ptr<comm::Communicator>;

// Group size, 1 for a null group.
int tp_size(const TpGroup& group);
int tp_rank(const TpGroup& group);

// Note [Tensor-parallel regions]. `x` in reduce_from_tp_region is consumed: when nothing else
// holds its storage, the all-reduce runs in place on it.
Variable copy_to_tp_region(const Variable& x, const TpGroup& group);
Variable reduce_from_tp_region(const Variable& x, const TpGroup& group);
// [..., C / tp] on each rank -> [..., C], rank r's columns at [r C / tp, (r + 1) C / tp).
Variable gather_from_tp_region(const Variable& x, const TpGroup& group);
// [..., C] (replicated) -> this rank's [..., C / tp] columns.
Variable scatter_to_tp_region(const Variable& x, const TpGroup& group);

// Note [Sequence-parallel layout]: [B, T / tp, ...] on each rank <-> [B, T, ...].
Variable gather_from_sequence_region(const Variable& x, const TpGroup& group);
Variable reduce_scatter_to_sequence_region(const Variable& x, const TpGroup& group);

// Note [Sequence-parallel saved input]
// Under sequence parallelism the column-parallel linears read the whole sequence, all-gathered
// from the ranks' [B, T / tp, C] shards. Saving that gathered [B, T, C] for their weight
// gradients would keep the linears' inputs whole (Korthikanti et al.'s 10sbh term would not
// shrink), so, as Megatron does, only the local shard is kept and the whole input is gathered
// again in backward. with_gathered_sequence(x, group, consumers) gathers x (the
// gather_from_sequence_region node: reduce-scatter backward), runs `consumers` on it (every layer
// reading that input: GPT-2's c_attn, its MLP, LLaMA's q/k/v or gate/up, a head), then releases
// the gathered tensor's bytes (Note [Released storage]: the consumers' nodes still view it) and
// keeps x's data instead. In backward, before the first of the consumers' nodes runs (on_backward
// on their outputs), the storage is materialized and all-gathered into again: the same bits, so
// the gradients are those of the kept-whole graph. Each consumer must save the gathered tensor
// itself (or views of it), not a copy, for the saving to be real; correctness does not depend on
// it. No graph (evaluation, a checkpointed block's first run): nothing is released. A checkpointed
// block's replay releases and gathers once more right away (an extra all-gather per region, no
// extra memory). A null or trivial group, or no sequence parallelism at the caller: consumers(x).
using GatheredConsumers = std::function<std::vector<Variable>(const Variable& gathered)>;
std::vector<Variable> with_gathered_sequence(const Variable& x, const TpGroup& group,
                                             const GatheredConsumers& consumers);

// This rank's slice of a replicated [B, T, ...] tensor in the sequence-parallel layout (a view of
// its flat buffer; no gradient flows through it): ids, targets, masks.
tensor::Tensor sequence_shard(const tensor::Tensor& full, const TpGroup& group);
// The positions (I64, [B, T / tp]) of the tokens this rank holds in the sequence-parallel layout
// of a [B, T] batch whose first position is `start`.
tensor::Tensor sequence_positions(int64_t batch, int64_t seq, int64_t start, const TpGroup& group,
                                  Device device);

}  // namespace strata::autograd

namespace strata::autograd {

// Note [Vocab-parallel cross-entropy]
// The mean cross-entropy of logits whose vocabulary is split over the group: rank r holds
// logits[..., vocab_start : vocab_start + Vl] and never sees the rest. Per row, the maximum, the
// sum of exp(logit - max) and the target's logit (on the one rank that holds it, 0 elsewhere) are
// each all-reduced ([rows] floats, not [rows, V]); loss = log(sum) + max - target logit. Only
// the first `classes` columns of the whole vocabulary count (Note [Padded vocabulary] in
// models/causal_lm.h): columns at or past it get probability 0 and gradient 0. Rows whose
// target is ignore_index count 0 and the mean is over the others (cross_entropy's semantics).
// Backward is local: d logits = (softmax - onehot) * g / m with the softmax from the saved
// exponentials and the all-reduced sum. The node keeps exp(logits - max), the size of the local
// logits, and not the logits. Low-precision (bf16, f16) logits are read into f32 first and every
// step runs in f32, as cross_entropy's are: the loss is f32, the saved exponentials are f32 (twice
// the local bf16 logits' bytes) and the gradient goes back in the logits' dtype. With a trivial
// group it is cross_entropy itself.
// A vocab-parallel embedding's local lookup: rows of `weight` at `ids` (local row numbers), times
// `mask` ([..., 1] of 0/1 in the weight's dtype): rows of ids outside this rank's slice come out
// zero and send no gradient. Keeps only ids and mask for backward.
Variable masked_embedding(const Variable& weight, const tensor::Tensor& ids,
                          const tensor::Tensor& mask);

Variable vocab_parallel_cross_entropy(const Variable& logits, const tensor::Tensor& targets,
                                      int64_t vocab_start, int64_t classes, const TpGroup& group,
                                      int64_t ignore_index = -100);

}  // namespace strata::autograd
