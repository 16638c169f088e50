// Test fixtures for the plugin loader: one source, built once per FIXTURE_*
// variant, each a library that is good or broken in one specific way.
#include <vaiq/vaiq.hpp>

#include <stdexcept>

namespace {

class CountingPass final : public vaiq::Pass {
  public:
    void configure(const vaiq::Options& options) override { limit_ = options.get_int("limit"); }
    bool run(vaiq::Model& model) override { return model.graph().node_size() > limit_; }

  private:
    int64_t limit_ = 0;
};

class ThrowingPass final : public vaiq::Pass {
  public:
    ThrowingPass() { throw std::runtime_error("no licence file found"); }
    bool run(vaiq::Model&) override { return false; }
};

class FixtureCalibrator final : public vaiq::Calibrator {
  public:
    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string&, const vaiq::QuantSpec&) const override {
        return nullptr;
    }
};

class FixtureAlgorithm final : public vaiq::Algorithm {
  public:
    void run(vaiq::AlgorithmContext&) override {}
};

[[maybe_unused]] const vaiq_option_descriptor kLimit[] = {
    {"limit", VAIQ_OPTION_INT, "3", "Nodes above which the pass reports a change."}};
[[maybe_unused]] const vaiq_option_descriptor kBadDefault[] = {{"ratio", VAIQ_OPTION_FLOAT, "abc", "A ratio."}};

// A descriptor written by hand, as a plugin built for another vaiq would carry.
[[maybe_unused]] vaiq_plugin_descriptor hand_made(uint32_t abi, const char* toolchain, uint32_t kind,
                                                  const char* version) {
    auto d = vaiq::describe<CountingPass>("fixture_odd", "1.0.0", "A hand-made descriptor", kLimit);
    d.abi_version = abi;
    d.toolchain = toolchain;
    d.kind = kind;
    d.version = version;
    return d;
}

}  // namespace

#if defined(FIXTURE_GOOD)
VAIQ_PLUGINS(vaiq::describe<CountingPass>("fixture_pass", "1.2.3", "Reports a change on graphs over a node limit",
                                          kLimit),
             vaiq::describe<FixtureCalibrator>("fixture_calibrator", "0.0.1", "A calibrator that observes nothing"))
#elif defined(FIXTURE_DUPLICATE)
VAIQ_PLUGINS(vaiq::describe<CountingPass>("fixture_pass", "9.9.9", "Same name as in the good fixture", kLimit))
#elif defined(FIXTURE_THROWING)
VAIQ_PLUGINS(vaiq::describe<ThrowingPass>("fixture_throwing", "1.0.0", "Its constructor throws"))
#elif defined(FIXTURE_WRONG_ABI)
VAIQ_PLUGINS(hand_made(VAIQ_ABI_VERSION + 2, VAIQ_TOOLCHAIN_TAG, VAIQ_KIND_PASS, "1.0.0"))
#elif defined(FIXTURE_WRONG_TOOLCHAIN)
VAIQ_PLUGINS(hand_made(VAIQ_ABI_VERSION, "msvc-1930/msvcrt", VAIQ_KIND_PASS, "1.0.0"))
#elif defined(FIXTURE_BAD_KIND)
VAIQ_PLUGINS(hand_made(VAIQ_ABI_VERSION, VAIQ_TOOLCHAIN_TAG, 9, "1.0.0"))
#elif defined(FIXTURE_BAD_VERSION)
VAIQ_PLUGINS(hand_made(VAIQ_ABI_VERSION, VAIQ_TOOLCHAIN_TAG, VAIQ_KIND_PASS, "one"))
#elif defined(FIXTURE_BAD_DEFAULT)
VAIQ_PLUGINS(vaiq::describe<CountingPass>("fixture_bad_default", "1.0.0", "An option default of the wrong type",
                                          kBadDefault))
#elif defined(FIXTURE_SWITCHED)
VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<FixtureAlgorithm>("fixture_algorithm", "1.0.0", "Switched on by settings"),
                              "extra_options.FixtureSearch, weight_only_algorithm=fixture|fixture_full",
                              "fast_finetune"))
#elif defined(FIXTURE_SWITCHED_PASS)
VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<CountingPass>("fixture_switched_pass", "1.0.0", "A pass with a switch",
                                                           kLimit),
                              "extra_options.FixtureSearch"))
#elif defined(FIXTURE_BAD_SWITCH)
VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<FixtureAlgorithm>("fixture_bad_switch", "1.0.0", "A switch mis-spelled"),
                              "weight_only_algorithm="))
#elif defined(FIXTURE_NO_ENTRY)
extern "C" __attribute__((visibility("default"))) int not_the_entry() { return 42; }
#else
#error "define one FIXTURE_* variant"
#endif
