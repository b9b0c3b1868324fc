#include "pagoda/kv/kv_types.h"

namespace pagoda::kv {

std::string_view miss_reason_name(MissReason reason) {
  switch (reason) {
    case MissReason::kHit: return "hit";
    case MissReason::kShorterThanBlock: return "shorter_than_block";
    case MissReason::kEvicted: return "evicted";
    case MissReason::kNeverSeen: return "never_seen";
    case MissReason::kBelowShareUnit: return "below_share_unit";
    case MissReason::kNotRead: return "not_read";
  }
  return "unknown";
}

std::string_view removal_reason_name(RemovalReason reason) {
  switch (reason) {
    case RemovalReason::kEvictedForSpace: return "evicted_for_space";
    case RemovalReason::kDroppedNamespace: return "dropped_namespace";
    case RemovalReason::kDroppedConversation: return "dropped_conversation";
    case RemovalReason::kTransferFailed: return "transfer_failed";
  }
  return "unknown";
}

std::string_view block_tier_name(BlockTier tier) { return tier == BlockTier::kHost ? "host" : "device"; }

std::string_view transfer_direction_name(TransferDirection direction) {
  return direction == TransferDirection::kHostToDevice ? "host_to_device" : "device_to_host";
}

}  // namespace pagoda::kv
