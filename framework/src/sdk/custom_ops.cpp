#include "vaiq/custom_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "vaiq/error.hpp"

namespace vaiq {

FixNeuronAttributes fixneuron_attributes(const onnx::NodeProto& node) {
    auto fail = [&](const std::string& why) {
        throw InputError(fmt::format("FixNeuron node '{}': {}", node.name(), why));
    };
    FixNeuronAttributes a;
    bool has_bits = false, has_pos = false;
    for (const auto& attr : node.attribute()) {
        if (attr.name() == "bit_width") {
            if (attr.type() != onnx::AttributeProto::INT) fail("bit_width must be an INT attribute");
            a.bit_width = static_cast<int>(std::clamp<int64_t>(attr.i(), -1, 64));
            has_bits = true;
        } else if (attr.name() == "pos") {
            int64_t pos = 0;
            if (attr.type() == onnx::AttributeProto::INT) {
                pos = attr.i();
            } else if (attr.type() == onnx::AttributeProto::STRING) {
                const auto& s = attr.s();
                const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), pos);
                if (ec != std::errc() || end != s.data() + s.size()) fail(fmt::format("pos '{}' is not an integer", s));
            } else {
                fail("pos must be an INT (or a STRING holding one)");
            }
            if (pos < -127 || pos > 127) fail(fmt::format("pos {} is outside [-127, 127]", pos));
            a.pos = static_cast<int>(pos);
            has_pos = true;
        } else if (attr.name() == "unsigned") {
            if (attr.type() != onnx::AttributeProto::INT) fail("unsigned must be an INT attribute");
            a.is_unsigned = attr.i() != 0;
        }
    }
    if (!has_bits || !has_pos) fail("needs the attributes bit_width and pos");
    if (a.bit_width < 2 || a.bit_width > 32) fail(fmt::format("bit_width {} is outside [2, 32]", a.bit_width));
    return a;
}

}  // namespace vaiq
