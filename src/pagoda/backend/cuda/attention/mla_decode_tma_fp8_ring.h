// The staging ring of the kTmaFp8 MLA decode kernel (mla_decode_tma_fp8.cu),
// shared with a host test of its barrier invariant (mla_decode_plan_test.cpp).
//
// A CTA walks its segments' 64-position tiles in order; tile t is staged as
// 4 uses of the ring (16 records each), use idx = 4 t + quarter, in ring slot
// idx % 5, and read by compute group t % 2. A slot's successive uses therefore
// go to either group, irregularly. mbarrier waits name a phase by its parity
// only, so a reader that skipped a phase of a barrier (consumed by the other
// group) could wait two phases ahead and pass at once. Each (group, slot)
// therefore has its own full and empty barrier: use idx signals barrier
// ring_barrier(idx), whose uses all belong to one group, which waits for every
// one of them in order; the producer, before reusing a slot, waits for the
// empty barrier of the slot's previous use, ring_barrier(idx - kRingSlots),
// likewise for every phase of every barrier in order (docs/KERNELS.md v17).
#pragma once

#if defined(__CUDACC__)
#define PAGODA_RING_FN __host__ __device__ __forceinline__
#else
#define PAGODA_RING_FN inline
#endif

namespace pagoda::kernels::cuda::tma_fp8_ring {

constexpr int kRingSlots = 5;     // staging slots of 16 records (10,496 B)
constexpr int kSlotsPerTile = 4;  // a 64-position tile is 4 slots
constexpr int kBarriers = 2 * kRingSlots;  // full (and empty) barriers: [group][slot]

PAGODA_RING_FN constexpr int ring_slot(int idx) { return idx % kRingSlots; }
PAGODA_RING_FN constexpr int ring_group(int idx) { return (idx / kSlotsPerTile) & 1; }
PAGODA_RING_FN constexpr int ring_barrier(int idx) { return ring_group(idx) * kRingSlots + ring_slot(idx); }

}  // namespace pagoda::kernels::cuda::tma_fp8_ring
