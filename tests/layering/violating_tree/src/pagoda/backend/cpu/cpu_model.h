#pragma once
#include "pagoda/core/status.h"
