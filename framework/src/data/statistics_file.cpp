#include "data/statistics_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "vaiq/error.hpp"
#include "vaiq/text.hpp"

namespace vaiq {

namespace {

constexpr const char* kFormat = "vaiq-calibration-statistics";
constexpr int kVersion = 1;

// FNV-1a over bytes, continued from `hash`.
uint64_t fnv1a(uint64_t hash, std::string_view bytes) {
    for (unsigned char c : bytes) {
        hash ^= c;
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

// The spec properties that change what an observer computes.
std::string spec_text(const QuantSpec& spec) {
    return fmt::format("{}{}{}{}", quant_type_name(spec.type), spec.symmetric ? " symmetric" : "",
                       spec.reduce_range ? " reduce_range" : "", spec.power_of_two ? " power_of_two" : "");
}

}  // namespace

std::string model_fingerprint(const Model& model) {
    // Piece by piece, so that a model of any size is hashed in bounded memory.
    uint64_t hash = 0xcbf29ce484222325ULL;
    const auto& graph = model.graph();
    for (const auto& input : graph.input()) hash = fnv1a(hash, input.SerializeAsString());
    for (const auto& output : graph.output()) hash = fnv1a(hash, output.SerializeAsString());
    for (const auto& node : graph.node()) hash = fnv1a(hash, node.SerializeAsString());
    for (const auto& init : graph.initializer()) {
        if (!is_deferred(init)) {
            hash = fnv1a(hash, init.SerializeAsString());
            continue;
        }
        // Its data, not where the file happens to be.
        onnx::TensorProto header = init;
        header.clear_external_data();
        hash = fnv1a(hash, header.SerializeAsString());
        read_deferred(init, [&](const char* p, size_t n) { hash = fnv1a(hash, std::string_view(p, n)); });
    }
    return fmt::format("fnv1a64:{:016x}", hash);
}

nlohmann::json statistics_file(const Observations& observations, const DraftPlan& plan,
                               const StatisticsIdentity& identity) {
    nlohmann::json out = {{"format", kFormat},
                          {"version", kVersion},
                          {"model_fingerprint", identity.model_fingerprint},
                          {"calibrators", identity.calibrators},
                          {"batches", observations.batches},
                          {"not_float", observations.not_float},
                          {"not_finite", observations.not_finite},
                          {"tensors", nlohmann::json::object()}};
    const auto owners = observing_tensors(plan);
    for (const auto& [name, observer] : observations.observers) {
        if (observations.not_finite.count(name)) continue;  // no range: it stays float
        const auto& owner = *owners.at(name);
        auto stats = observer->statistics();
        if (stats.empty())
            throw InputError(fmt::format("calibrator '{}' cannot save its statistics (tensor '{}'): calibrate and "
                                         "quantize in one `vaiq run`",
                                         owner.calibrate_method, name));
        out["tensors"][name] = {{"calibrator", owner.calibrate_method},
                                {"spec", spec_text(owner.spec)},
                                {"statistics", std::move(stats)}};
    }
    return out;
}

void merge_statistics_file(Observations& into, const DraftPlan& plan, const StatisticsIdentity& identity,
                           const nlohmann::json& file, const std::filesystem::path& path) {
    const auto where = path.string();
    auto field = [&](const char* key) -> const nlohmann::json& {
        if (!file.is_object() || !file.contains(key))
            throw InputError(fmt::format("{}: not a vaiq calibration statistics file (no '{}')", where, key));
        return file.at(key);
    };
    try {
        if (field("format") != kFormat)
            throw InputError(fmt::format("{}: not a vaiq calibration statistics file (format {})", where,
                                         field("format").dump()));
        if (field("version") != kVersion)
            throw InputError(fmt::format("{}: statistics format version {} (this vaiq reads version {})", where,
                                         field("version").dump(), kVersion));
        if (field("model_fingerprint") != identity.model_fingerprint)
            throw InputError(fmt::format(
                "{}: computed on another model or preparation ({}; this run prepares {}): calibrate with the same "
                "model and recipe, and no data-aware preparation (include_cle, SmoothQuant) that differs per shard",
                where, field("model_fingerprint").get<std::string>(), identity.model_fingerprint));
        const auto& calibrators = field("calibrators");
        for (const auto& [method, options] : identity.calibrators) {
            if (!calibrators.contains(method))
                throw InputError(fmt::format("{}: has no statistics of calibrator '{}'", where, method));
            for (const auto& [option, value] : options.items())
                if (calibrators.at(method).value(option, nlohmann::json()) != value)
                    throw InputError(fmt::format("{}: calibrator '{}' ran with {}: {}, this run has {}", where, method,
                                                 option, calibrators.at(method).value(option, nlohmann::json()).dump(),
                                                 value.dump()));
        }
        const auto& tensors = field("tensors");
        const auto owners = observing_tensors(plan);
        std::vector<std::string> missing;
        for (const auto& name : file.value("not_finite", nlohmann::json::array()))
            into.not_finite.insert(name.get<std::string>());
        for (auto& [name, observer] : into.observers) {
            if (into.not_finite.count(name)) continue;
            if (!tensors.contains(name)) {
                missing.push_back(name);
                continue;
            }
            const auto& saved = tensors.at(name);
            const auto& owner = *owners.at(name);
            if (saved.at("calibrator") != owner.calibrate_method || saved.at("spec") != spec_text(owner.spec))
                throw InputError(fmt::format("{}: tensor '{}' was calibrated by {} as {}; this run plans {} as {}",
                                             where, name, saved.at("calibrator").dump(), saved.at("spec").dump(),
                                             owner.calibrate_method, spec_text(owner.spec)));
            observer->merge(saved.at("statistics").get<Statistics>());
            into.held_values.insert(name);
        }
        if (!missing.empty())
            throw InputError(fmt::format("{}: no statistics of {} tensor(s) this run observes: {}", where,
                                         missing.size(), join(missing, ", ")));
        for (const auto& name : field("not_float")) into.not_float.insert(name.get<std::string>());
        into.batches += field("batches").get<int>();
    } catch (const nlohmann::json::exception& e) {
        throw InputError(fmt::format("{}: damaged statistics file: {}", where, e.what()));
    }
}

nlohmann::json ort_calibration_json(const CalibrationOutcome& outcome) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, result] : outcome.results) out[name] = {result.range.min, result.range.max};
    return out;
}

std::string tensorrt_calibration_cache(const CalibrationOutcome& outcome) {
    // The largest magnitude either end reaches (a negative-heavy tensor's is its minimum).
    std::string out;
    for (const auto& [name, result] : outcome.results)
        out += fmt::format("{} {}\n", name, std::max(std::abs(result.range.min), std::abs(result.range.max)));
    return out;
}

}  // namespace vaiq
