// The operation graphs of cuDNN fused attention, forward and backward (Note [cuDNN SDPA] in
// cudnn_sdpa.cpp): the nodes cudnn-frontend lowers its SDPA nodes to, built with the backend API.
#include "tensor/cuda/sdpa_plan.h"

#if STRATA_HAVE_CUDNN

#include <cudnn_graph.h>

#include "tensor/cuda/sdpa_graph.h"

namespace strata::tensor::cuda {

namespace {

// s with -inf where key j > query i + (Tk - Tq) (Note [cuDNN SDPA], masking).
D causal_mask(GraphBuilder& g, D s, const SdpaKey& k) {
  const Dims sd = {k.b, k.h, k.tq, k.tk};
  D row = g.virt(CUDNN_DATA_INT32, sd);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, CUDNN_DATA_INT32, nullptr, 2);
  D col = g.virt(CUDNN_DATA_INT32, sd);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, CUDNN_DATA_INT32, nullptr, 3);
  if (k.tq != k.tk) {  // bottom-right alignment: row + Tk - Tq
    D plus = g.virt(CUDNN_DATA_INT32, sd);
    g.pointwise(CUDNN_POINTWISE_ADD, row, g.scalar(kSkv, CUDNN_DATA_INT32), plus, CUDNN_DATA_INT32);
    D shifted = g.virt(CUDNN_DATA_INT32, sd);
    g.pointwise(CUDNN_POINTWISE_SUB, plus, g.scalar(kSq, CUDNN_DATA_INT32), shifted,
                CUDNN_DATA_INT32);
    row = shifted;
  }
  D keep = g.virt(CUDNN_DATA_BOOLEAN, sd);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  D out = g.virt(CUDNN_DATA_FLOAT, sd);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, g.scalar(kNegInf, CUDNN_DATA_FLOAT), out,
              CUDNN_DATA_FLOAT, keep);
  return out;
}

cudnnDataType_t io_type(const SdpaKey& k) {
  return k.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// The strides of operand `op` as the key holds them (Note [Strided attention operands]).
Dims strides_of(const SdpaKey& k, SdpaOperand op) {
  const auto& s = k.strides[op];
  return {s[0], s[1], s[2], 1};
}

// A [B, H, T, D] operand in its own layout.
D operand(GraphBuilder& g, int64_t uid, const SdpaKey& k, SdpaOperand op) {
  const int64_t t = op == kSdpaK || op == kSdpaV || op == kSdpaDK || op == kSdpaDV ? k.tk : k.tq;
  return g.tensor(uid, io_type(k), {k.b, k.h, t, k.d}, strides_of(k, op));
}

// K (or V) [B, H, Tk, D] described as its transpose [B, H, D, Tk] (the same memory).
D transposed(GraphBuilder& g, int64_t uid, const SdpaKey& k, SdpaOperand op) {
  const Dims s = strides_of(k, op);
  return g.tensor(uid, io_type(k), {k.b, k.h, k.d, k.tk}, {s[0], s[1], 1, s[2]});
}

}  // namespace

void build_forward(GraphBuilder& g, const SdpaKey& k) {
  const cudnnDataType_t io = io_type(k), f32 = CUDNN_DATA_FLOAT;
  const Dims sd = {k.b, k.h, k.tq, k.tk}, rd = {k.b, k.h, k.tq, 1};
  D q = operand(g, kQ, k, kSdpaQ);
  D kt = transposed(g, kK, k, kSdpaK);
  D v = operand(g, kV, k, kSdpaV);
  D o = operand(g, kO, k, kSdpaO);
  D stats = g.tensor(kStats, f32, rd, packed(rd));
  D scale = g.scalar(kScale, f32);

  D s = g.virt(f32, sd);
  g.matmul(q, kt, s);
  D scaled = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  if (k.causal) scaled = causal_mask(g, scaled, k);
  // Softmax with Stats = max + log(sum exp(s - max)), as cudnn-frontend's composite softmax.
  D max = g.virt(f32, rd);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max);
  D centred = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, max, centred);
  D e = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, e);
  D sum = g.virt(f32, rd);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  D log_sum = g.virt(f32, rd);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  D p = g.virt(io, sd);  // the second matmul takes P in the io type
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, p);
  g.matmul(p, v, o);
}

void build_backward(GraphBuilder& g, const SdpaKey& k) {
  const cudnnDataType_t io = io_type(k), f32 = CUDNN_DATA_FLOAT;
  const Dims qd = {k.b, k.h, k.tq, k.d}, kd = {k.b, k.h, k.tk, k.d};
  const Dims sd = {k.b, k.h, k.tq, k.tk}, rd = {k.b, k.h, k.tq, 1};
  const Dims td = {k.b, k.h, k.tk, k.tq}, ts = {k.h * k.tq * k.tk, k.tq * k.tk, 1, k.tk};
  D q = operand(g, kQ, k, kSdpaQ);
  D kt = transposed(g, kK, k, kSdpaK);
  D vt = transposed(g, kV, k, kSdpaV);
  D o = operand(g, kO, k, kSdpaO);
  D stats = g.tensor(kStats, f32, rd, packed(rd));
  D dout = operand(g, kDO, k, kSdpaDO);
  D dq = operand(g, kDQ, k, kSdpaDQ);
  D dk = operand(g, kDK, k, kSdpaDK);
  D dv = operand(g, kDV, k, kSdpaDV);
  D scale = g.scalar(kScale, f32);

  // Row sums D = sum(dO * O), kept in the caller's workspace (kRowSum).
  D prod = g.virt(f32, qd);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, prod);
  D red = g.virt(f32, rd);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, red);
  D row_sum = g.tensor(kRowSum, f32, rd, packed(rd));
  g.pointwise(CUDNN_POINTWISE_MUL, red, g.scalar(kOne, f32), row_sum);  // the dropout slot, 1

  // P = exp(Q K^T * scale - Stats), masked.
  D s = g.virt(f32, sd);
  g.matmul(q, kt, s);
  D scaled = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  D centred = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, centred);
  if (k.causal) centred = causal_mask(g, centred, k);
  D p = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, p);

  // dV = P^T dO
  D pt = g.virt(io, td, ts);
  g.reshape(p, pt);
  g.matmul(pt, dout, dv);

  // dS = P * (dO V^T - D) * scale
  D dp = g.virt(f32, sd);
  g.matmul(dout, vt, dp);
  D diff = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, row_sum, diff);
  D dsp = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, diff, p, dsp);
  D ds = g.virt(f32, sd);
  g.pointwise(CUDNN_POINTWISE_MUL, dsp, scale, ds);

  // dK = dS^T Q
  D dst = g.virt(io, td, ts);
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);

  // dQ = dS K straight into dQ: no f32 atomic accumulator, so the engine takes its
  // deterministic path (Note [cuDNN SDPA], determinism).
  D k_rows = g.virt(f32, kd, strides_of(k, kSdpaK));  // K's own layout, as kt's
  g.reshape(kt, k_rows);
  g.matmul(ds, k_rows, dq);
}

}  // namespace strata::tensor::cuda

#endif  // STRATA_HAVE_CUDNN
