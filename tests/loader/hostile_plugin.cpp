// Plugins that fail or misbehave on purpose, one of each kind, all named
// "hostile": `fail_in` names the interface method that throws a
// std::runtime_error; the calibrator's `bad` returns invalid results, the
// pass's `break_graph` leaves a node reading a tensor nothing defines.
#include <vaiq/vaiq.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace {

const vaiq_option_descriptor kFailIn[] = {
    {"fail_in", VAIQ_OPTION_STRING, "", "The method that throws (empty: none)."}};
const vaiq_option_descriptor kCalibratorOptions[] = {
    {"fail_in", VAIQ_OPTION_STRING, "", "The method that throws (empty: none)."},
    {"bad", VAIQ_OPTION_STRING, "",
     "nan_range, reversed_range, zero_scale, negative_scale, nan_scale or zero_points: what to get wrong."}};
const vaiq_option_descriptor kPassOptions[] = {
    {"fail_in", VAIQ_OPTION_STRING, "", "The method that throws (empty: none)."},
    {"break_graph", VAIQ_OPTION_BOOL, "false", "Add a node that reads a tensor nothing defines."}};

// The `fail_in` option, and the throw it asks for.
class FailsIn {
  public:
    void read(const vaiq::Options& options) { method_ = options.get_string("fail_in"); }
    void maybe_fail(const char* method) const {
        if (method_ == method) throw std::runtime_error(std::string("deliberate failure in ") + method);
    }

  private:
    std::string method_;
};

class HostileTarget final : public vaiq::Target {
  public:
    void configure(const vaiq::Options& options) override { fails_.read(options); }
    bool supports(const onnx::NodeProto& node) const override {
        fails_.maybe_fail("supports");
        return node.op_type() == "Conv" || node.op_type() == "Gemm" || node.op_type() == "MatMul";
    }
    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::QuantRequest& request) const override {
        fails_.maybe_fail("default_spec");
        return vaiq::spec_from_request(role, request);
    }
    void check(const vaiq::QuantRequest&) const override { fails_.maybe_fail("check"); }
    std::vector<vaiq::ConstraintCount> refine(const vaiq::Model&, vaiq::QuantPlan&,
                                              const vaiq::QuantRequest&) const override {
        fails_.maybe_fail("refine");
        return {};
    }
    std::vector<vaiq::ConstraintCount> verify(const vaiq::Model&, const vaiq::QuantRequest&) const override {
        fails_.maybe_fail("verify");
        return {};
    }

  private:
    FailsIn fails_;
};

// Writes nothing: enough to show where a format's failure is reported.
class HostileFormat final : public vaiq::Format {
  public:
    void configure(const vaiq::Options& options) override { fails_.read(options); }
    void emit(vaiq::Model&, const vaiq::QuantPlan&) const override { fails_.maybe_fail("emit"); }

  private:
    FailsIn fails_;
};

class HostileObserver final : public vaiq::RangeObserver {
  public:
    HostileObserver(const FailsIn& fails, std::string bad) : fails_(fails), bad_(std::move(bad)) {}
    void observe(const vaiq::TensorView<float>& batch) override {
        fails_.maybe_fail("observe");
        for (float v : batch.data) lo_ = std::min(lo_, v), hi_ = std::max(hi_, v);
    }
    vaiq::CalibrationResult result() const override {
        fails_.maybe_fail("result");
        vaiq::CalibrationResult r;
        r.range = {std::min(lo_, 0.0f), std::max(hi_, 0.0f)};
        if (bad_ == "nan_range") r.range.max = std::numeric_limits<float>::quiet_NaN();
        if (bad_ == "reversed_range") r.range = {1.0f, -1.0f};
        return r;
    }

  private:
    const FailsIn& fails_;
    std::string bad_;
    float lo_ = std::numeric_limits<float>::infinity(), hi_ = -std::numeric_limits<float>::infinity();
};

class HostileCalibrator final : public vaiq::Calibrator {
  public:
    void configure(const vaiq::Options& options) override {
        fails_.read(options);
        bad_ = options.get_string("bad");
    }
    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string&, const vaiq::QuantSpec&) const override {
        fails_.maybe_fail("make_observer");
        return std::make_unique<HostileObserver>(fails_, bad_);
    }
    vaiq::QuantParams constant_params(const vaiq::Tensor& data, const vaiq::QuantSpec& spec) const override {
        fails_.maybe_fail("constant_params");
        auto p = vaiq::Calibrator::constant_params(data, spec);
        const float wrong = bad_ == "zero_scale"       ? 0.0f
                            : bad_ == "negative_scale" ? -0.5f
                            : bad_ == "nan_scale"      ? std::numeric_limits<float>::quiet_NaN()
                                                       : 1.0f;
        if (!bad_.empty() && bad_.find("scale") != std::string::npos) p.scale.assign(p.scale.size(), wrong);
        if (bad_ == "zero_points") p.zero_point.push_back(0);
        return p;
    }

  private:
    FailsIn fails_;
    std::string bad_;
};

class HostilePass final : public vaiq::Pass {
  public:
    void configure(const vaiq::Options& options) override {
        fails_.read(options);
        break_graph_ = options.get_bool("break_graph");
    }
    bool run(vaiq::Model& model) override {
        fails_.maybe_fail("run");
        if (!break_graph_) return false;
        auto* node = model.graph().add_node();
        node->set_op_type("Relu");
        node->set_name("dangling");
        node->add_input("no_such_tensor");
        node->add_output("dangling_out");
        return true;
    }

  private:
    FailsIn fails_;
    bool break_graph_ = false;
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<HostileTarget>("hostile", "1.0.0", "A target that fails on request", kFailIn),
             vaiq::describe<HostileFormat>("hostile", "1.0.0", "A format that fails on request", kFailIn),
             vaiq::describe<HostileCalibrator>("hostile", "1.0.0", "A calibrator that fails or lies on request",
                                               kCalibratorOptions),
             vaiq::describe<HostilePass>("hostile", "1.0.0", "A pass that fails or breaks the graph on request",
                                         kPassOptions))
