#pragma once
// Whether the engine overlaps its steps with the device's (EngineConfig::overlap_steps).

#include <cstdint>

namespace pagoda::engine {

enum class OverlapSteps : uint8_t { kAuto, kOn, kOff };

}  // namespace pagoda::engine
