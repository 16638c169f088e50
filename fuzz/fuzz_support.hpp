// What the fuzz targets share: a scratch folder per process for the inputs vaiq
// reads from files, and the rule for what counts as a finding.
//
// A target feeds vaiq bytes it would read from a user's file. vaiq may refuse
// them with InputError (a clear message is the right answer to garbage); any
// other exception, a crash, a hang or a sanitizer report is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string_view>

#include "vaiq/error.hpp"

namespace vaiq::fuzz {

/// A folder for this process's files, created on first use.
const std::filesystem::path& scratch();

/// Writes `size` bytes to scratch()/name and returns the path.
std::filesystem::path write_input(std::string_view name, const uint8_t* data, size_t size);

/// Runs `body`: InputError is an accepted outcome, anything else aborts with
/// the exception's message, so that libFuzzer keeps the input as a crash.
template <typename Body>
void expect_only_input_errors(Body&& body) {
    try {
        body();
    } catch (const InputError&) {
    } catch (const std::exception& e) {
        std::fprintf(stderr, "not an input error: %s\n", e.what());
        std::abort();
    }
}

}  // namespace vaiq::fuzz
