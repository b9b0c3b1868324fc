#pragma once
#include "pagoda/backend/cpu/cpu_model.h"  // engine may not see a backend
