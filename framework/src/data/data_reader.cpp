#include "data/data_reader.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "recipe/defaults.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq {

std::unique_ptr<DataReader> no_data() {
    class None final : public DataReader {
      public:
        std::optional<Batch> next() override { return std::nullopt; }
        void rewind() override {}
        size_t items() const override { return 0; }
    };
    return std::make_unique<None>();
}

std::unique_ptr<DataReader> first_batches(DataReader& all, size_t limit) {
    class First final : public DataReader {
      public:
        First(DataReader& all, size_t limit) : all_(all), limit_(limit) {}
        std::optional<Batch> next() override { return read_++ < limit_ ? all_.next() : std::nullopt; }
        void rewind() override {
            all_.rewind();
            read_ = 0;
        }
        size_t items() const override { return std::min(limit_, all_.items()); }

      private:
        DataReader& all_;
        size_t limit_, read_ = 0;
    };
    return std::make_unique<First>(all, limit);
}

void DataReaders::add(std::string name, PluginInstance<Reader> reader) {
    readers_.emplace_back(std::move(name), std::move(reader));
}

DataReaders DataReaders::all_of(const PluginRegistry& registry) {
    DataReaders out;
    for (const auto* info : registry.list(PluginKind::Reader))
        out.add(info->name, registry.create<Reader>(info->name, registry.resolve_options(*info, nullptr)));
    return out;
}

std::unique_ptr<DataReader> DataReaders::open(const fs::path& path, const Model& model, const std::string& what) const {
    if (feed_inputs(model.graph()).empty())
        throw InputError(fmt::format("the model has no inputs to feed {} to", what));
    std::error_code ec;
    if (!fs::exists(path, ec)) throw InputError(fmt::format("{} {} does not exist", what, path.string()));
    int best = 0;
    std::vector<const std::pair<std::string, PluginInstance<Reader>>*> claimants;
    for (const auto& reader : readers_) {
        const int claim = reader.second->claim(path);
        if (claim > best) claimants.clear();
        if (claim > 0 && claim >= best) {
            best = claim;
            claimants.push_back(&reader);
        }
    }
    if (claimants.empty()) {
        std::vector<std::string> names;
        for (const auto& [name, reader] : readers_) names.push_back(name);
        throw InputError(
            fmt::format("{} {} is nothing the readers take (readers: {}; `vaiq plugins` says what "
                        "each reads)",
                        what, path.string(), names.empty() ? "none" : join(names)));
    }
    if (claimants.size() > 1)
        throw InputError(
            fmt::format("{} {}: readers '{}' and '{}' both claim it at {}; a reader meant to replace "
                        "another claims more",
                        what, path.string(), claimants[0]->first, claimants[1]->first, best));
    log_debug("{} {}: read by reader '{}'", what, path.string(), claimants[0]->first);
    return claimants[0]->second->open(path, model, what);
}

std::unique_ptr<DataReader> DataReaders::open_random(const Model& model) const {
    for (const auto& [name, reader] : readers_)
        if (name == defaults::kRandomReader) return reader->open({}, model, "random data");
    throw InputError(fmt::format("no calibration data, and no reader '{}' to make random data is installed",
                                 defaults::kRandomReader));
}

namespace {

// The installed plugins (the built-in folder and VAIQ_PLUGIN_PATH), loaded once:
// the readers of callers outside a run (dump_model, tests).
const PluginRegistry& installed_plugins() {
    static const PluginRegistry registry = [] {
        PluginRegistry r;
        r.load_default_paths();
        return r;
    }();
    return registry;
}

}  // namespace

std::unique_ptr<DataReader> open_data_reader(const fs::path& path, const Model& model, const std::string& what) {
    static const DataReaders installed = DataReaders::all_of(installed_plugins());
    return installed.open(path, model, what);
}

std::unique_ptr<DataReader> random_data_reader(const Model& model, const nlohmann::json& shapes,
                                               const nlohmann::json& ranges, int batches, uint64_t seed) {
    const auto& registry = installed_plugins();
    const auto& info = registry.require(PluginKind::Reader, defaults::kRandomReader, "random data");
    const nlohmann::json options = {{"random_data_reader_input_shape", shapes},
                                    {"RandomDataReaderInputDataRange", ranges},
                                    {"batches", batches},
                                    {"seed", seed}};
    return registry.create<Reader>(info.name, registry.resolve_options(info, options))->open({}, model, "random data");
}

}  // namespace vaiq
