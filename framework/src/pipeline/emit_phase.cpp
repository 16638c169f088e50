// The emit and check phases: the plan written into the float model by the
// run's format, then what the target promised checked on what was written.
#include <fmt/format.h>

#include "pipeline/run_state.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/text.hpp"

namespace vaiq::phases {

void emit_phase(RunSetup& setup, const Model& model, const Planning& planning, Written& out, nlohmann::json& report) {
    out.quantized = emit_plan(setup, model, planning.plan, rounded_for(planning, planning.plan));
    report["quantized"] = true;
    report["model"]["quantized_tensors"] = planning.plan.tensors.size();
    report["model"]["nodes_after"] = out.quantized.graph().node_size();
}

// What refinement promised, checked on what was written. The target reads
// standard Q/DQ: a format's own pairs (Vitis Q/DQ, FixNeuron) through the
// format's conversion, where it has one for the model.
void check_phase(RunSetup& s, const Model& quantized, nlohmann::json& report) {
    check_model(quantized);
    if (s.last < Phase::Emit) return;
    // Only a model with the format's own ops is copied (a large model's weights would double).
    const Model* readable = &quantized;
    Model native;
    if (s.format().wrote(quantized)) {
        native = quantized;
        try {
            s.format().to_native(native);
            readable = &native;
        } catch (const InputError&) {  // not for every tensor (32-bit ones): checked as written
        }
    }
    const auto checked = s.target->verify(*readable, s.run);
    if (checked.empty()) return;
    report["constraints_written"] = constraints_json(checked, false);
    std::vector<std::string> broken;
    for (const auto& c : checked)
        if (c.violated > 0) broken.push_back(fmt::format("{} on {} of {} nodes", c.name, c.violated, c.checked));
    if (!broken.empty())
        log_warn("the written model breaks device constraints: {} (see the report's constraints_written)",
                 join(broken, "; "));
    else
        log_info("device constraints hold in the written model ({} checks)", checked.size());
}

}  // namespace vaiq::phases
