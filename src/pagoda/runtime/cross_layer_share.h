#pragma once
// Cross-layer KV sharing (`--kv-cross-layer-share K`, MiniCache-style): the
// upper half of the layer stack, layers [L - L/2, L), is cut into groups of K
// consecutive layers (the last group may be shorter) and each group stores one
// KV "slot" instead of K. The lower layers keep a slot each. So the pool holds
// num_slots() = first_shared() + ceil((L - first_shared()) / K) layers' worth
// of K/V, plus the small per-token norm records below.
//
// What a shared slot holds (the merge, written at write time): per (token, KV
// head), for K and for V separately, one unit *direction* vector in the KV
// dtype, the merge of the group's layers' directions, and a record of K + 1 f32
// numbers: each member layer's own norm of its vector, then the length of the
// sum of the member directions merged so far. Member 0 writes its direction
// (sum length 1); member j > 0 adds its unit direction to the stored sum
// (direction x length), renormalizes and stores the new direction and length.
// The direction is thus the normalized mean of the members' directions (for
// K = 2 exactly MiniCache's SLERP at t = 0.5), and member layer l reads
// norm_l x direction: the magnitudes are kept per layer, the directions are
// shared. Within one forward, member j attends over the merge of members
// 0..j for the forward's own tokens (later members have not run yet) and over
// the full merge for tokens of earlier forwards, so outputs depend on where a
// prompt is split into forwards (tests compare runs split alike).
//
// Thread safety: plain values.

#include <cstdint>
#include <string_view>

#include "pagoda/core/status.h"

namespace pagoda::runtime {

struct CrossLayerShare {
  int32_t num_layers = 0;
  int32_t group = 1;  // K; 1: off

  bool enabled() const { return group > 1 && num_layers > 1; }
  // The first layer of the shared region (num_layers when off).
  int32_t first_shared() const { return enabled() ? num_layers - num_layers / 2 : num_layers; }
  // Layers' worth of K/V the pool holds.
  int32_t num_slots() const {
    const int32_t first = first_shared();
    return first + (num_layers - first + group - 1) / group;
  }
  // Slots with norm records: the shared region's.
  int32_t num_shared_slots() const { return num_slots() - first_shared(); }
  int32_t slot_of(int32_t layer) const {
    const int32_t first = first_shared();
    return layer < first ? layer : first + (layer - first) / group;
  }
  // The layer's position in its group (0 for the first member), -1 outside the shared region.
  int32_t member_of(int32_t layer) const {
    const int32_t first = first_shared();
    return layer < first ? -1 : (layer - first) % group;
  }
  // f32 numbers per (token, KV head) for one of K or V: one norm per member, then the sum length.
  int32_t norm_record() const { return enabled() ? group + 1 : 0; }
};

// K against the model: 1 <= K <= num_layers / 2. Errors are kInvalidArgument naming `flag`.
Status validate_cross_layer_share(int32_t group, int32_t num_layers, std::string_view flag);

}  // namespace pagoda::runtime
