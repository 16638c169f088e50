#include "vaiq/error.hpp"

namespace vaiq {

// Out-of-line destructors anchor the typeinfo in libvaiq, so a plugin's throw
// and the host's catch agree on the type.
InputError::InputError(const std::string& message) : std::runtime_error(message) {}
InputError::~InputError() = default;
InternalError::InternalError(const std::string& message) : std::logic_error(message) {}
InternalError::~InternalError() = default;

}  // namespace vaiq
