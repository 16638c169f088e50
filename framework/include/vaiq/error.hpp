// vaiq/error.hpp - the two kinds of failure the host reports.
#pragma once

#include <stdexcept>
#include <string>

#include "vaiq/export.hpp"

namespace vaiq {

/// Something the user can fix: a bad model, recipe, option, plugin or data file.
/// The CLI prints the message as one line and exits with status 1.
class VAIQ_API InputError : public std::runtime_error {
  public:
    explicit InputError(const std::string& message);
    ~InputError() override;
};

/// A broken invariant inside vaiq or a plugin. The CLI exits with status 2.
class VAIQ_API InternalError : public std::logic_error {
  public:
    explicit InternalError(const std::string& message);
    ~InternalError() override;
};

}  // namespace vaiq
