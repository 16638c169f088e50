#include "segmented_run.hpp"

#include <algorithm>

#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

// What a node reads: its inputs and what its subgraphs read from the graph around it.
std::vector<std::string> reads(const onnx::NodeProto& node) {
    std::vector<std::string> out(node.input().begin(), node.input().end());
    for (auto& outer : outer_scope_reads(node)) out.push_back(std::move(outer));
    std::erase(out, std::string());
    return out;
}

size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.size()) * element_size(t.type()); }

// A graph input or output of `value`'s element type and rank, its dimensions left
// open (the last batch may be shorter than the first).
void describe(onnx::ValueInfoProto& info, const std::string& name, const Tensor& value) {
    info.set_name(name);
    auto* type = info.mutable_type()->mutable_tensor_type();
    type->set_elem_type(static_cast<int32_t>(value.type()));
    auto* shape = type->mutable_shape();
    for (size_t d = 0; d < value.shape().size(); ++d)
        shape->add_dim()->set_dim_param("segment_dim_" + std::to_string(d));
}

}  // namespace

bool SegmentedRun::compute(const Model& model, const std::string& tensor,
                           const std::function<void(size_t, const Tensor&)>& take) {
    if (failed_) return false;
    const auto& g = model.graph();
    std::map<std::string, int> producer;
    std::map<std::string, std::vector<int>> readers;
    for (int i = 0; i < g.node_size(); ++i) {
        for (const auto& o : g.node(i).output())
            if (!o.empty()) producer[o] = i;
        for (const auto& r : reads(g.node(i))) readers[r].push_back(i);
    }
    std::map<std::string, const onnx::TensorProto*> initializers;
    for (const auto& t : g.initializer()) initializers[t.name()] = &t;
    std::map<std::string, const onnx::ValueInfoProto*> inputs;
    for (const auto& i : g.input())
        if (!initializers.count(i.name())) inputs[i.name()] = &i;
    auto is_kept = [&](const std::string& t) { return !kept_.empty() && kept_.front().count(t) > 0; };

    // The nodes to run: `tensor`'s ancestors back to kept values, inputs and initializers.
    std::set<int> run;
    std::set<std::string> from_kept, from_inputs, from_initializers;
    for (std::vector<std::string> pending{tensor}; !pending.empty();) {
        const std::string t = std::move(pending.back());
        pending.pop_back();
        if (initializers.count(t)) {
            from_initializers.insert(t);
        } else if (is_kept(t)) {
            from_kept.insert(t);
        } else if (inputs.count(t)) {
            from_inputs.insert(t);
        } else if (auto p = producer.find(t); p != producer.end()) {
            if (run.insert(p->second).second)
                for (auto& r : reads(g.node(p->second))) pending.push_back(std::move(r));
        } else {
            return give_up();  // read from outside the graph: not a model this can split
        }
    }
    auto is_run = [&](int i) { return run.count(i) > 0 || computed_.count(g.node(i).output(0)) > 0; };
    if (run.empty()) {  // kept, or an input of the model
        data_.rewind();
        size_t b = 0;
        for (auto batch = data_.next(); batch; batch = data_.next(), ++b) {
            const auto it = batch->find(tensor);
            take(b, it != batch->end() ? it->second : kept_.at(b).at(tensor));
        }
        return true;
    }

    // The segment: those nodes, reading the kept values as inputs; its outputs are
    // `tensor` and whatever of theirs a node not run yet reads.
    onnx::ModelProto segment = model.proto();
    auto* sg = segment.mutable_graph();
    sg->clear_node();
    sg->clear_initializer();
    sg->clear_input();
    sg->clear_output();
    sg->clear_value_info();
    for (const int i : run) *sg->add_node() = g.node(i);  // std::set: in graph order
    for (const auto& t : from_initializers) *sg->add_initializer() = *initializers.at(t);
    for (const auto& t : from_inputs) *sg->add_input() = *inputs.at(t);
    for (const auto& t : from_kept) describe(*sg->add_input(), t, kept_.front().at(t));
    std::vector<std::string> outputs{tensor};
    for (const int i : run)
        for (const auto& o : g.node(i).output()) {
            if (o.empty() || o == tensor) continue;
            const auto r = readers.find(o);
            if (r != readers.end() &&
                std::any_of(r->second.begin(), r->second.end(), [&](int j) { return !is_run(j); }))
                outputs.push_back(o);
        }
    for (const auto& o : outputs) sg->add_output()->set_name(o);
    const Model segment_model(std::move(segment));
    const auto runner = context_.runner(segment_model, true);

    data_.rewind();
    size_t b = 0;
    for (auto batch = data_.next(); batch; batch = data_.next(), ++b) {
        if (kept_.size() <= b) kept_.resize(b + 1);
        auto& kept = kept_[b];
        Feeds feeds;
        for (const auto& t : from_inputs) {
            auto it = batch->find(t);
            if (it == batch->end()) return give_up();
            feeds.emplace(t, std::move(it->second));
        }
        for (const auto& t : from_kept) feeds.emplace(t, kept.at(t));
        auto values = runner->run(feeds);
        take(b, values.front());
        for (size_t k = 0; k < outputs.size() && k < values.size(); ++k) {
            kept_bytes_ += bytes_of(values[k]);
            kept[outputs[k]] = std::move(values[k]);
        }
    }
    for (const int i : run) computed_.insert(g.node(i).output(0));
    // Values every reader of which has run are kept no longer.
    for (auto& kept : kept_)
        std::erase_if(kept, [&](const auto& entry) {
            const auto r = readers.find(entry.first);
            const bool done = r == readers.end() || std::all_of(r->second.begin(), r->second.end(), is_run);
            if (done) kept_bytes_ -= bytes_of(entry.second);
            return done;
        });
    if (kept_bytes_ > budget_) {  // this call delivered; the next ones run the whole model
        log_info("the values kept between segments of the run outgrew {:.0f} MB: it runs whole from here on",
                 static_cast<double>(budget_) / (1 << 20));
        give_up();
    }
    return true;
}

bool SegmentedRun::give_up() {
    failed_ = true;
    kept_.clear();
    kept_bytes_ = 0;
    return false;
}

}  // namespace vaiq
