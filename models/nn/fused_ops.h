#pragma once
// Whether the model zoo calls fused ops or the compositions they replace.
//
// Note [Fused ops in models]
// GPT-2 and LLaMA fuse each residual add into the norm after it (Note [Fused residual norm] in
// tensor/ops.h): block i leaves its MLP output un-added and block i+1 adds it to the residual
// stream inside its first norm (the last block's, inside ln_f / norm), so a block maps (residual,
// pending branch) to (residual, pending branch). GPT-2's MLP runs as one node on the
// linear-epilogue ops (Note [Linear epilogues]); LLaMA's SwiGLU MLP as one node on the unfused
// ops that keeps less (Note [SwiGLU recompute]). On the CPU every fused path gives the unfused
// bits in f32; the residual fusion and LLaMA's MLP do in bf16/f16 too, GPT-2's MLP does not (one
// rounding instead of several). The unfused path stays available as the reference the tests compare against and
// for benchmarks. The switch is process-wide and read at each forward (not per module), and a
// change takes effect at the next forward; never flip it between a forward and its backward.
// Its initial value comes from the environment: STRATA_FUSED_OPS=off starts with the unfused
// compositions (in `train`, the benchmarks, anything), on or unset with the fused ops.
//
// Under activation checkpointing a block completes its own last add, so that the checkpoint keeps
// one tensor per block (the block's input) and not two; only the add inside the block is fused.
namespace strata::models::nn {

bool fused_ops_enabled();  // STRATA_FUSED_OPS (on unless "off") until set_fused_ops
void set_fused_ops(bool on);

// Switches fused ops on or off for a scope (tests, benchmarks).
class FusedOpsGuard {
 public:
  explicit FusedOpsGuard(bool on) : prev_(fused_ops_enabled()) { set_fused_ops(on); }
  ~FusedOpsGuard() { set_fused_ops(prev_); }
  FusedOpsGuard(const FusedOpsGuard&) = delete;
  FusedOpsGuard& operator=(const FusedOpsGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace strata::models::nn
