#pragma once
// The MLP's gated activation, SiLU(gate) * up in f32: one expression for every kernel that applies it
// (silu_mul and its fp8 forms in elementwise.cu, the gate_up GEMV's epilogue in gemv.cu), so a fused and
// an unfused path round alike and can be compared bit for bit.

namespace pagoda::cuda {

__device__ __forceinline__ float silu_mul_value(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

}  // namespace pagoda::cuda
