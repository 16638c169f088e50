// edge_npu: a third-party target with a documented switch of its own. Its
// option table declares EdgeFuseRelu; a capital first makes it an extra
// option, so a recipe sets it under extra_options and vaiq checks its name
// and type against this table, with the recipe's file and line.
#include <vaiq/vaiq.hpp>

namespace {

class EdgeNpu final : public vaiq::Target {
  public:
    void configure(const vaiq::Options& options) override { fuse_relu_ = options.get_bool("EdgeFuseRelu"); }

    bool supports(const onnx::NodeProto& node) const override {
        return vaiq::is_default_domain(node) && (node.op_type() == "Conv" || node.op_type() == "Relu");
    }

    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::QuantRequest& request) const override {
        return vaiq::spec_from_request(role, request);
    }

    bool fuses(const onnx::NodeProto& producer, const onnx::NodeProto& consumer, const vaiq::GraphIndex&,
               const vaiq::QuantRequest&) const override {
        return fuse_relu_ && producer.op_type() == "Conv" && consumer.op_type() == "Relu";
    }

  private:
    bool fuse_relu_ = false;
};

const vaiq_option_descriptor kOptions[] = {
    {"EdgeFuseRelu", VAIQ_OPTION_BOOL, "false", "Compute a Relu inside the Conv before it (no pair between them)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<EdgeNpu>("edge_npu", "1.0.0", "A small NPU: Conv and Relu", kOptions))
