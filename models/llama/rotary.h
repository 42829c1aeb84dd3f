#pragma once
// Rotary position embedding tables shared by every attention layer of a model.
//
// Note [LLaMA rotary convention]
// Rotary embedding (Su et al. 2021) rotates pairs of q and k features of each head by the angle
// t * theta^(-2i/D) at position t, pair i in [0, D/2). Two conventions pair the features
// differently:
//   interleaved  pairs (2i, 2i + 1): Meta's reference LLaMA (view_as_complex), tensor::rotary;
//   rotate_half  pairs (i, i + D/2): HF transformers' LlamaForCausalLM.
// They are the same model up to a fixed permutation of each head's q and k output rows, which
// is why HF's convert_llama_weights_to_hf.py permutes q_proj and k_proj. Strata uses the
// interleaved convention: it is tensor::rotary's (no extra copies or permutes per step), and
// Meta's original checkpoints need only the rename table. HF checkpoints need the rows of
// q_proj.weight (n = num_attention_heads) and k_proj.weight (n = num_key_value_heads)
// un-permuted on load, w.view(n, 2, D/2, C).transpose(1, 2).reshape(n * D, C), and permuted
// back on save, w.view(n, D/2, 2, C).transpose(1, 2).reshape(n * D, C). v_proj, o_proj and
// everything else are unaffected. tests/reference/gen_llama_tiny.py checks this equivalence
// against a rotate_half forward with the permuted weights.
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace strata::models::llama {

using tensor::Tensor;

// cos/sin tables [max_len, head_dim / 2] (tensor::rotary_tables), computed once on the host.
// They are constants of the architecture, not parameters or buffers: nothing trains them and a
// checkpoint need not carry them (HF's inv_freq is likewise a non-persistent buffer).
class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, int64_t max_len, double theta);

  // Tables for positions [0, T) on `device`, views valid while this object lives. The first
  // call for a device other than the host copies the tables there once. Not thread-safe for
  // concurrent first calls on a new device (a model's forward runs on one thread).
  std::pair<Tensor, Tensor> tables(int64_t T, Device device) { return tables(0, T, device); }
  // Tables for positions [start, start + T) (decoding with a KV cache: Note [KV cache]).
  std::pair<Tensor, Tensor> tables(int64_t start, int64_t T, Device device);

  int64_t head_dim() const { return head_dim_; }
  int64_t max_len() const { return max_len_; }

 private:
  struct OnDevice {
    Device device;
    Tensor cos, sin;
  };
  int64_t head_dim_, max_len_;
  std::vector<OnDevice> copies_;  // [0] is the host
};

}  // namespace strata::models::llama
