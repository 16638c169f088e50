# Precompiled headers: what nearly every translation unit parses (the standard
# library, the ONNX protobuf classes, nlohmann-json, fmt) is parsed once per
# target instead of once per file. That parsing is most of a host or test
# file's compile time, and the project is built three times in CI.
include_guard(GLOBAL)
option(VAIQ_PRECOMPILED_HEADERS "Precompile the common headers of the libraries and tests" ON)

set(VAIQ_PCH_HEADERS
  <algorithm> <cmath> <cstdint> <functional> <map> <memory> <optional> <set> <string>
  <string_view> <utility> <vector>
  <fmt/format.h> <nlohmann/json.hpp> <onnx/onnx_pb.h>)

# vaiq_precompile_headers(<target> [GTEST]): the common headers (and GoogleTest's) for <target>.
function(vaiq_precompile_headers target)
  if(NOT VAIQ_PRECOMPILED_HEADERS)
    return()
  endif()
  set(_headers ${VAIQ_PCH_HEADERS})
  if("GTEST" IN_LIST ARGN)
    list(APPEND _headers <gtest/gtest.h>)
  endif()
  target_precompile_headers(${target} PRIVATE ${_headers})
endfunction()

# vaiq_reuse_precompiled_headers(<target> <owner>): <target> includes <owner>'s
# precompiled header instead of making its own (it must be compiled with the same flags).
function(vaiq_reuse_precompiled_headers target owner)
  if(VAIQ_PRECOMPILED_HEADERS)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endif()
endfunction()
