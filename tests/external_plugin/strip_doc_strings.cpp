// strip_doc_strings: a third-party pass that removes doc strings from a
// model's nodes (and, unless told otherwise, from the model and graph).
#include <vaiq/vaiq.hpp>

namespace {

class StripDocStrings final : public vaiq::Pass {
  public:
    void configure(const vaiq::Options& options) override { keep_model_doc_ = options.get_bool("keep_model_doc"); }

    bool run(vaiq::Model& model) override {
        int removed = 0;
        auto strip = [&](auto& proto) {
            if (!proto.doc_string().empty()) {
                proto.clear_doc_string();
                ++removed;
            }
        };
        if (!keep_model_doc_) {
            strip(model.proto());
            strip(model.graph());
        }
        for (auto& node : *model.graph().mutable_node()) strip(node);
        vaiq::log_info("strip_doc_strings removed {} doc strings", removed);
        return removed > 0;
    }

  private:
    bool keep_model_doc_ = false;
};

const vaiq_option_descriptor kOptions[] = {
    {"keep_model_doc", VAIQ_OPTION_BOOL, "false", "Keep the model's and the graph's own doc strings."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<StripDocStrings>("strip_doc_strings", "1.0.0", "Remove doc strings from nodes", kOptions))
