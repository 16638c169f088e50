// vaiq/vaiq.hpp - the whole plugin SDK.
#pragma once

#include "vaiq/abi.h"
#include "vaiq/calibrator.hpp"
#include "vaiq/dpu.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/histogram.hpp"
#include "vaiq/log.hpp"
#include "vaiq/model.hpp"
#include "vaiq/options.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/plugin.hpp"
#include "vaiq/qdq_view.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/target.hpp"
#include "vaiq/tensor.hpp"
