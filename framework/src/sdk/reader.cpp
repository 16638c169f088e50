// What reader plugins share: an input's feeds and dimensions, natural file order.
#include "vaiq/reader.hpp"

#include <cctype>
#include <set>

namespace vaiq {

DataReader::~DataReader() = default;

std::vector<const onnx::ValueInfoProto*> feed_inputs(const onnx::GraphProto& graph) {
    std::set<std::string> constants;
    for (const auto& init : graph.initializer()) constants.insert(init.name());
    std::vector<const onnx::ValueInfoProto*> out;
    for (const auto& in : graph.input())
        if (!constants.count(in.name())) out.push_back(&in);
    return out;
}

std::optional<std::vector<std::optional<int64_t>>> declared_dims(const onnx::ValueInfoProto& input) {
    if (!input.type().has_tensor_type() || !input.type().tensor_type().has_shape()) return std::nullopt;
    std::vector<std::optional<int64_t>> dims;
    for (const auto& d : input.type().tensor_type().shape().dim())
        dims.push_back(d.has_dim_value() ? std::optional<int64_t>(d.dim_value()) : std::nullopt);
    return dims;
}

bool natural_less(std::string_view a, std::string_view b) {
    auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (digit(a[i]) && digit(b[j])) {
            size_t ie = i, je = j;
            while (ie < a.size() && digit(a[ie])) ++ie;
            while (je < b.size() && digit(b[je])) ++je;
            auto na = a.substr(i, ie - i), nb = b.substr(j, je - j);
            na.remove_prefix(std::min(na.find_first_not_of('0'), na.size()));
            nb.remove_prefix(std::min(nb.find_first_not_of('0'), nb.size()));
            if (na.size() != nb.size()) return na.size() < nb.size();
            if (na != nb) return na < nb;
            i = ie;
            j = je;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i;
            ++j;
        }
    }
    return a.size() - i < b.size() - j;
}

}  // namespace vaiq
