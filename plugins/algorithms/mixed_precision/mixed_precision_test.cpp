// Automatic mixed precision's search: the shortest prefix of the ranking that
// meets the target, a greedy search where none does, and the choice confirmed
// on batches held out of it.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "data/data_reader.hpp"
#include "mixed_precision.hpp"
#include "pipeline/algorithm_context.hpp"
#include "report/agreement.hpp"
#include "runtime/executor.hpp"
#include "screening.hpp"
#include "test_support.hpp"
#include "vaiq/pair_emitter.hpp"
#include "vaiq/reader.hpp"

using vaiq::Tensor;
using vaiq::test::GraphBuilder;

namespace {

// Candidates that `model_of` builds for each raised set, counted one tensor a
// tensor and measured against `reference` as the run's context measures them,
// on the batch sets of vaiq::in_batch_set; `measured` counts them by set.
vaiq::Raising raising_on(const vaiq::ReferenceBatches& reference,
                         std::function<vaiq::Model(const std::set<std::string>&)> model_of,
                         std::shared_ptr<std::array<int, 4>> measured = nullptr) {
    auto parts = std::make_shared<std::array<vaiq::ReferenceBatches, 4>>();  // by BatchSet
    for (size_t set = 0; set < parts->size(); ++set) {
        auto& part = (*parts)[set];
        part = reference;
        part.feeds.clear(), part.outputs.clear();
        for (size_t b = 0; b < reference.feeds.size(); ++b) {
            if (!vaiq::in_batch_set(b, reference.feeds.size(), static_cast<vaiq::BatchSet>(set))) continue;
            part.feeds.push_back(reference.feeds[b]);
            part.outputs.push_back(reference.outputs[b]);
        }
    }
    vaiq::Raising raise;
    raise.count = [](const std::set<std::string>& raised) { return raised.size(); };
    raise.measure = [parts, model_of, measured](const std::set<std::string>& raised, vaiq::BatchSet batches) {
        if (measured) ++(*measured)[static_cast<size_t>(batches)];
        const auto& part = (*parts)[static_cast<size_t>(batches)];
        if (part.feeds.empty()) return vaiq::OutputAgreement{};
        return vaiq::measure_output(model_of(raised), part, 1);
    };
    raise.output = {reference.describe_outputs(), reference.describe_measures()};
    return raise;
}

// y = x + error: what a model computes when `error` is left by the tensors raised.
vaiq::Model model_with_error(float error) {
    GraphBuilder b;
    b.input("x", {2, 4}).output("y", {2, 4});
    b.initializer("e", Tensor::from_values<float>({1}, std::vector<float>{error}));
    b.node("Add", {"x", "e"}, {"y"});
    return b.build();
}

// `batches` reference batches of the float model y = x.
vaiq::ReferenceBatches identity_reference(int batches) {
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    for (int i = 0; i < batches; ++i) {
        std::vector<float> x(8);
        for (int k = 0; k < 8; ++k) x[k] = static_cast<float>((k * 3 + i) % 7) - 3.0f;
        const auto t = Tensor::from_values<float>({2, 4}, x);
        reference.feeds.push_back({{"x", t}});
        reference.outputs.push_back({t});
    }
    return reference;
}

// A ranking of `tensors` in this order, every one an activation costing the same alone.
std::vector<vaiq::TensorSensitivity> ranking_of(const std::vector<std::string>& tensors) {
    std::vector<vaiq::TensorSensitivity> out;
    for (const auto& t : tensors)
        out.push_back({t, vaiq::TensorRole::Activation, vaiq::QuantType::QInt8, 10.0, 5.0, false});
    return out;
}

// Ten tensors t0..t9, ranked in that order, each removing 0.02 / (k + 1) of the error alone.
struct ShrinkingGains {
    std::vector<vaiq::TensorSensitivity> ranking;
    std::map<std::string, float> removes;
    ShrinkingGains() {
        std::vector<std::string> names;
        for (int k = 0; k < 10; ++k) {
            names.push_back("t" + std::to_string(k));
            removes[names.back()] = 0.02f / static_cast<float>(k + 1);
        }
        ranking = ranking_of(names);
    }
};

// When no prefix of the ranking reaches the target, the search measures what
// each candidate gains on top of those raised. Here the ranking (by the cost of
// each tensor alone) lists a and b first, but raising either changes little;
// only c removes the error. y = x + the error left by the raised set.
TEST(MixedPrecisionSearch, OutOfReachByTheRankingItRaisesWhatMeasurablyHelps) {
    vaiq::ReferenceBatches reference = identity_reference(3);
    const std::map<std::string, float> removes = {{"a", 0.1f}, {"b", 0.05f}, {"c", 0.9f}};
    int built = 0;
    const auto raise = raising_on(reference, [&](const std::set<std::string>& raised) {
        ++built;
        float error = 1.0f;
        for (const auto& t : raised) error -= removes.at(t);
        return model_with_error(error);
    });
    const auto ranking = ranking_of({"a", "b", "c"});
    vaiq::MixedPrecisionTarget target;
    target.sqnr_db = 15.0;  // the error must fall to 0.1 or below: c is needed
    const auto result = vaiq::search_mixed_precision(target, [&] { return ranking; }, raise, 1);
    EXPECT_EQ(result.raised, (std::set<std::string>{"c"}));
    EXPECT_TRUE(result.report["met"].get<bool>()) << result.report.dump();
    EXPECT_LE(built, 8) << "each candidate measured once, not every subset";

    // With eight batches (six searched, two held out) the candidates are first
    // measured on a third of the searched ones, the best then on all of them.
    for (int i = 3; i < 8; ++i) {
        reference.feeds.push_back(reference.feeds[i % 3]);
        reference.outputs.push_back(reference.outputs[i % 3]);
    }
    auto measured = std::make_shared<std::array<int, 4>>();
    const auto screened = raising_on(
        reference,
        [&](const std::set<std::string>& raised) {
            float error = 1.0f;
            for (const auto& t : raised) error -= removes.at(t);
            return model_with_error(error);
        },
        measured);
    const auto again = vaiq::search_mixed_precision(
        target, [&] { return ranking; }, screened, 1);
    EXPECT_EQ(again.raised, (std::set<std::string>{"c"}));
    EXPECT_EQ((*measured)[static_cast<size_t>(vaiq::BatchSet::Screening)], 3) << "each candidate screened once";
    EXPECT_LE((*measured)[static_cast<size_t>(vaiq::BatchSet::Searched)], 4)
        << "nothing raised, the whole budget, and the best candidate on the searched batches";
}

// Once no candidate measurably helps, only the most promising by their last
// estimate are screened again before the search stops, not all of them: here
// 50 candidates, of which only c helps; after c is raised, six are measured
// again on the searched batches and at most 32 of the rest screened.
TEST(MixedPrecisionSearch, ARescreenCoversTheMostPromisingCandidatesOnly) {
    const vaiq::ReferenceBatches reference = identity_reference(8);
    auto measured = std::make_shared<std::array<int, 4>>();
    const auto raise = raising_on(
        reference,
        [&](const std::set<std::string>& raised) { return model_with_error(raised.count("c") ? 0.1f : 1.0f); },
        measured);
    std::vector<std::string> names;
    for (int k = 0; k < 49; ++k) names.push_back("t" + std::to_string(k));
    names.push_back("c");
    const auto ranking = ranking_of(names);
    vaiq::MixedPrecisionTarget target;
    target.sqnr_db = 40.0;  // out of reach: the search stops when nothing helps
    const auto result = vaiq::search_mixed_precision(
        target, [&] { return ranking; }, raise, 21);
    EXPECT_EQ(result.raised, (std::set<std::string>{"c"}));
    EXPECT_EQ((*measured)[static_cast<size_t>(vaiq::BatchSet::Screening)], 50 + 32)
        << "every candidate screened once, then the 32 best of the rest again";
}

// Raising the ten tensors of the budget together removes most of the error (they
// act together), one at a time each removes little, less and less: once the
// greedy search's shrinking steps cannot reach the prefix's error within the
// budget, it stops, and the prefix is kept.
TEST(MixedPrecisionSearch, AGreedySearchThatCannotOvertakeThePrefixStops) {
    const vaiq::ReferenceBatches reference = identity_reference(3);
    const ShrinkingGains tensors;
    const auto& [ranking, removes] = tensors;
    auto error_of = [&](const std::set<std::string>& raised) {
        if (raised.size() == removes.size()) return 0.3f;
        float error = 1.0f;
        for (const auto& t : raised) error -= removes.at(t);
        return error;
    };
    const auto raise =
        raising_on(reference, [&](const std::set<std::string>& raised) { return model_with_error(error_of(raised)); });
    vaiq::MixedPrecisionTarget target;
    target.sqnr_db = 40.0;  // out of reach
    const auto result = vaiq::search_mixed_precision(
        target, [&] { return ranking; }, raise, 10);
    EXPECT_EQ(result.raised.size(), 10u) << "the prefix, better than any greedy step";
    int greedy_steps = 0;
    for (const auto& t : result.report["tried"]) greedy_steps += t.value("search", "") == "greedy";
    EXPECT_EQ(greedy_steps, 2) << "two steps show the gains shrink: " << result.report["tried"].dump();
}

// The ranking lists four tensors that hurt when raised before six that help
// less and less, so the greedy search soon passes every prefix. Once the
// larger of its last two gains per tensor, over the budget left, cannot reach
// the target, it stops: after three steps here, where every one of the six
// would still have helped a little.
TEST(MixedPrecisionSearch, AGreedySearchThatCannotReachTheTargetStops) {
    const vaiq::ReferenceBatches reference = identity_reference(3);
    std::map<std::string, float> removes;  // negative: adds error
    for (int k = 0; k < 4; ++k) removes["bad" + std::to_string(k)] = -0.1f;
    const std::vector<float> gains = {0.3f, 0.1f, 0.05f, 0.03f, 0.02f, 0.01f};
    for (size_t k = 0; k < gains.size(); ++k) removes["good" + std::to_string(k)] = gains[k];
    std::vector<std::string> names;
    for (const auto& [name, removed] : removes) names.push_back(name);  // "bad..." sort first
    const auto ranking = ranking_of(names);
    const auto raise = raising_on(reference, [&](const std::set<std::string>& raised) {
        float error = 1.0f;
        for (const auto& t : raised) error -= removes.at(t);
        return model_with_error(error);
    });
    vaiq::MixedPrecisionTarget target;
    // 30 dB needs the error below 0.07; all six leave 0.49. After two steps
    // (6.0 -> 9.1 -> 10.5 dB) eight more at 3.1 dB a tensor would reach it;
    // after the third (11.2 dB), seven more at 1.3 dB would not.
    target.sqnr_db = 30.0;
    const auto result = vaiq::search_mixed_precision(
        target, [&] { return ranking; }, raise, 10);
    EXPECT_EQ(result.raised, (std::set<std::string>{"good0", "good1", "good2"})) << result.report.dump();
    EXPECT_FALSE(result.report["met"].get<bool>());
}

TEST(MixedPrecisionSearch, ScreeningIsEveryThirdSearchedBatch) {
    std::vector<size_t> screening;
    for (size_t b = 0; b < 12; ++b)
        if (vaiq::in_batch_set(b, 12, vaiq::BatchSet::Screening)) screening.push_back(b);
    EXPECT_EQ(screening, (std::vector<size_t>{0, 4, 8})) << "searched: 0 1 2 4 5 6 8 9 10";
    for (size_t b = 0; b < 5; ++b)
        EXPECT_EQ(vaiq::in_batch_set(b, 5, vaiq::BatchSet::Screening), b != 3) << "fewer than six searched: all";
}

// A model that meets the target with nothing raised, on the searched and the
// held-out batches, is not ranked: the ranking costs an inference per tensor.
TEST(MixedPrecisionSearch, AModelThatMeetsTheTargetIsNotRanked) {
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    for (int i = 0; i < 4; ++i) {
        const auto t = Tensor::from_values<float>({2, 2}, std::vector<float>{1.0f + i, 2, 3, 4});
        reference.feeds.push_back({{"x", t}});
        reference.outputs.push_back({t});
    }
    const auto raise = raising_on(reference, [](const std::set<std::string>&) {
        GraphBuilder b;
        b.input("x", {2, 2}).output("y", {2, 2});
        b.node("Identity", {"x"}, {"y"});
        return b.build();
    });
    int ranked = 0;
    auto rank = [&] {
        ++ranked;
        return std::vector<vaiq::TensorSensitivity>{};
    };
    vaiq::MixedPrecisionTarget target;
    target.top1_drop = 0.01;
    const auto result = vaiq::search_mixed_precision(target, rank, raise, 2);
    EXPECT_TRUE(result.report["met"].get<bool>()) << result.report.dump();
    EXPECT_TRUE(result.report["held_out"]["met"].get<bool>());
    EXPECT_TRUE(result.raised.empty());
    EXPECT_EQ(ranked, 0);
}

// A choice that meets the target only on the batches it was made on is
// extended until every fourth batch, held out of the search, meets it too.
// The candidates clip y = x at 2^|raised set|: the searched batches stay within
// [-1, 1], the held-out ones (3 and 7) reach 5.
TEST(MixedPrecisionSearch, TheChoiceIsConfirmedOnBatchesHeldOutOfTheSearch) {
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    for (int i = 0; i < 8; ++i) {
        const float reach = i % 4 == 3 ? 5.0f : 1.0f;
        std::vector<float> x(8);
        for (int k = 0; k < 8; ++k) x[k] = reach * (static_cast<float>((k * 3 + i) % 9) / 4.0f - 1.0f);
        const auto t = Tensor::from_values<float>({2, 4}, x);
        reference.feeds.push_back({{"x", t}});
        reference.outputs.push_back({t});
    }
    const auto raise = raising_on(reference, [](const std::set<std::string>& raised) {
        const float bound = std::ldexp(0.5f, static_cast<int>(raised.size()));
        GraphBuilder b;
        b.input("x", {2, 4}).output("y", {2, 4});
        b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{-bound}));
        b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{bound}));
        b.node("Clip", {"x", "lo", "hi"}, {"y"});
        return b.build();
    });
    const auto ranking = ranking_of({"a", "b", "c", "d", "e", "f"});
    vaiq::MixedPrecisionTarget target;
    target.sqnr_db = 40.0;
    const auto result = vaiq::search_mixed_precision(target, [&] { return ranking; }, raise, 6);
    const auto& held = result.report["held_out"];
    EXPECT_EQ(held["batches"], 2);
    EXPECT_TRUE(held["met"].get<bool>()) << result.report.dump();
    EXPECT_GE(result.raised.size(), 4u) << "a bound of 8 holds the held-out 5s; two raised (a bound of 2) did not";
    EXPECT_TRUE(result.report["met"].get<bool>());
    // Within a budget too small for the held-out batches, the run says the choice does not carry.
    const auto short_of_it = vaiq::search_mixed_precision(target, [&] { return ranking; }, raise, 2);
    EXPECT_FALSE(short_of_it.report["held_out"]["met"].get<bool>());
    EXPECT_FALSE(short_of_it.report["met"].get<bool>());
}

// Out of reach, a set that agrees with the float model on one row more but is
// much noisier is not the better one: a row or two of top-1 agreement is the
// calibration data's noise, and SQNR decides. 100 rows; y = x + e(raised set).
TEST(MixedPrecisionSearch, TopOneAgreementsARowApartAreTiedAndSqnrDecides) {
    constexpr int64_t kRows = 100;
    std::vector<float> x(2 * kRows);
    for (int64_t r = 0; r < kRows; ++r) {
        x[2 * r] = r < 3 ? 0.5f : 0.0f;  // rows 0-2 are close calls
        x[2 * r + 1] = r < 3 ? 0.6f : 1.0f;
    }
    // The error each raised set leaves on the first column, row by row.
    auto error_of = [&](const std::set<std::string>& raised) {
        std::vector<float> e(2 * kRows, 0.0f);
        const bool a = raised.count("a") > 0, b = raised.count("b") > 0;
        for (int64_t r = 0; r < kRows; ++r)
            e[2 * r] = a && b ? (r < 2 ? 0.15f : 0.0f)  // rows 0 and 1 flip, no noise: 98 %
                       : a    ? (r == 0  ? 0.3f
                                 : r < 3 ? 0.05f
                                         : 0.3f)  // row 0 flips, noise everywhere: 99 %
                              : 0.3f;                // rows 0-2 flip: 97 %
        return e;
    };
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    const auto input = Tensor::from_values<float>({kRows, 2}, x);
    reference.feeds.push_back({{"x", input}});
    reference.outputs.push_back({input});
    const auto raise = raising_on(reference, [&](const std::set<std::string>& raised) {
        GraphBuilder b;
        b.input("x", {kRows, 2}).output("y", {kRows, 2});
        b.initializer("e", Tensor::from_values<float>({kRows, 2}, error_of(raised)));
        b.node("Add", {"x", "e"}, {"y"});
        return b.build();
    });
    const auto ranking = ranking_of({"a", "b"});
    vaiq::MixedPrecisionTarget target;
    target.top1_drop = 0.0;  // every row: out of reach
    const auto result = vaiq::search_mixed_precision(target, [&] { return ranking; }, raise, 2);
    EXPECT_FALSE(result.report["met"].get<bool>());
    EXPECT_EQ(result.raised, (std::set<std::string>{"a", "b"})) << result.report.dump();
}

}  // namespace

namespace {

// Standard QuantizeLinear/DequantizeLinear pairs, weights stored quantized.
class QdqPairs final : public vaiq::PairEmitter {
  protected:
    void check(const vaiq::TensorQuant&, const vaiq::Model&) const override {}
    void add_pair(vaiq::Model& model, vaiq::UniqueNames& names, const vaiq::TensorQuant& t, const std::string& input,
                  const std::string& output) const override {
        auto& graph = model.graph();
        const auto [scale, zero_point] = add_params(graph, names, t);
        const auto quantized = names.fresh(t.tensor + "_q");
        vaiq::make_node(graph, names, "QuantizeLinear", {input, scale, zero_point}, {quantized}, t.tensor + "_Q");
        vaiq::make_node(graph, names, "DequantizeLinear", {quantized, scale, zero_point}, {output}, t.tensor + "_DQ");
    }
};

}  // namespace

// The greedy search's screening simulates the quantized model on the float one
// and forks where each candidate's change first matters: x -> MatMul(w1) h ->
// Relu r -> MatMul(w2) y. Its estimate of each raising (to 16 bits, or float
// with a weight's product) agrees with the emitted QDQ model's measurement.
TEST(MixedPrecisionScreening, EstimatesAgreeWithTheQuantizedModels) {
    GraphBuilder b;
    b.input("x", {2, 8}).output("y", {2, 4});
    std::vector<float> w1(64), w2(32), x(64);
    for (size_t i = 0; i < w1.size(); ++i) w1[i] = std::sin(0.7f * static_cast<float>(i)) * 0.6f;
    for (size_t i = 0; i < w2.size(); ++i) w2[i] = std::cos(1.3f * static_cast<float>(i)) * 0.8f;
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i * i % 17)) * 2.0f;
    b.initializer("w1", Tensor::from_values<float>({8, 8}, w1));
    b.initializer("w2", Tensor::from_values<float>({8, 4}, w2));
    b.node("MatMul", {"x", "w1"}, {"h"});
    b.node("Relu", {"h"}, {"r"});
    b.node("MatMul", {"r", "w2"}, {"y"});
    const auto model = b.build();
    const auto dir = vaiq::test::temp_dir();
    vaiq::write_npy(dir / "x.npy", Tensor::from_values<float>({8, 8}, x));  // four batches of two
    auto data = vaiq::open_data_reader(dir / "x.npy", model);

    // Ranges from the float model on the data, then the plan at 8 or 16 bits.
    std::map<std::string, vaiq::TensorRange> ranges;
    vaiq::runtime::Executor float_run(model, {.threads = 1});
    auto widen = [&](const std::string& name, const Tensor& value) {
        auto& r = ranges[name];
        for (const float v : value.data<float>()) r.min = std::min(r.min, v), r.max = std::max(r.max, v);
    };
    for (auto batch = data->next(); batch; batch = data->next())
        float_run.run(batch->feeds, {"x", "h", "r", "y"}, widen);
    data->rewind();
    widen("w1", Tensor::from_values<float>({8, 8}, w1));
    widen("w2", Tensor::from_values<float>({8, 4}, w2));
    auto plan_with = [&](const std::set<std::string>& raised, const vaiq::Precision& precision) {
        vaiq::QuantPlan plan;
        std::set<std::string> left_float;
        for (const char* w : {"w1", "w2"})  // a weight left float leaves its product float
            if (precision.keep_float && raised.count(w)) left_float.insert({w, w == std::string("w1") ? "h" : "y"});
        for (const char* t : {"x", "w1", "h", "r", "w2", "y"}) {
            if (raised.count(t) && precision.keep_float) continue;
            if (left_float.count(t)) continue;
            const bool weight = t[0] == 'w';
            vaiq::QuantSpec spec;
            spec.type = raised.count(t) ? precision.activation_type : vaiq::QuantType::QInt8;
            spec.symmetric = weight;
            plan.tensors.push_back({t, weight ? vaiq::TensorRole::Weight : vaiq::TensorRole::Activation, spec,
                                    vaiq::compute_quant_params(ranges.at(t), spec)});
        }
        return plan;
    };
    auto emit = [&](const vaiq::QuantPlan& plan) {
        auto out = model;
        QdqPairs().emit(out, plan, {});
        return out;
    };
    const auto reference = vaiq::reference_batches(model, *data, 0, 0, 1);
    const auto base_plan = plan_with({}, {});
    vaiq::AlgorithmInputs in(model, base_plan, *data, 1);
    in.raised_plan = [&](const std::set<std::string>& raised, const vaiq::Precision& precision, size_t*) {
        return plan_with(raised, precision);
    };
    vaiq::BatchThreads split{1, 1};  // batches one at a time, then two (below)
    in.agreements = [&](size_t variants, const vaiq::Model&, const std::function<vaiq::VariantRun(int)>& make_run, int,
                        vaiq::Batches,
                        std::optional<size_t>) { return vaiq::measure_outputs(variants, make_run, split, reference); };
    vaiq::HostAlgorithmContext context(std::move(in));

    const std::vector<std::string> candidates{"x", "w1", "h", "r", "w2"};
    for (const bool keep_float : {false, true}) {
        vaiq::Precision precision{vaiq::QuantType::QInt16, vaiq::QuantType::QInt16, keep_float};
        for (const std::set<std::string>& raised : {std::set<std::string>{}, std::set<std::string>{"r"}}) {
            split = {1, 1};
            const auto estimates =
                vaiq::screen_raisings(context, precision, 0, raised, candidates, vaiq::BatchSet::All);
            ASSERT_EQ(estimates.raised.size(), candidates.size());
            // Two batches at a time, a runner each, count in the batches' order: the same sums to the bit.
            split = {2, 1};
            const auto at_twice = vaiq::screen_raisings(context, precision, 0, raised, candidates, vaiq::BatchSet::All);
            ASSERT_EQ(at_twice.raised.size(), candidates.size());
            for (size_t i = 0; i < candidates.size(); ++i) {
                ASSERT_TRUE(at_twice.raised[i] && estimates.raised[i]) << candidates[i];
                EXPECT_EQ(at_twice.raised[i]->sqnr_db, estimates.raised[i]->sqnr_db) << candidates[i];
                EXPECT_EQ(at_twice.raised[i]->top1_agreement, estimates.raised[i]->top1_agreement) << candidates[i];
            }
            const auto before = vaiq::measure_output(emit(plan_with(raised, precision)), reference, 1);
            ASSERT_TRUE(estimates.base.has_value());
            EXPECT_NEAR(estimates.base->sqnr_db, before.sqnr_db, 0.5) << "the shared plan's own estimate";
            for (size_t i = 0; i < candidates.size(); ++i) {
                auto with = raised;
                with.insert(candidates[i]);
                ASSERT_TRUE(estimates.raised[i].has_value()) << candidates[i];
                const auto exact = vaiq::measure_output(emit(plan_with(with, precision)), reference, 1);
                EXPECT_NEAR(estimates.raised[i]->sqnr_db, exact.sqnr_db, 0.5)
                    << candidates[i] << (keep_float ? " left float" : " at 16 bits") << " on top of " << raised.size()
                    << " raised";
                EXPECT_EQ(estimates.raised[i]->batches, 4);
            }
            // The estimates tell the candidates apart: raising the first weight helps.
            const auto w1 =
                static_cast<size_t>(std::find(candidates.begin(), candidates.end(), "w1") - candidates.begin());
            EXPECT_GT(estimates.raised[w1]->sqnr_db, before.sqnr_db + 1.0);
        }
    }
}

// The ranking forks the float model's run where each tensor is computed and
// runs only what follows; it must measure what a whole inference of the model
// written with that tensor alone quantized measures. Two convolutions (which
// the written model's executor runs channels-last), a fitted weight, and a
// constant only a folded Transpose reads (measured on its written model).
TEST(Ranking, ForkedRunsMeasureWhatTheWrittenModelsMeasure) {
    GraphBuilder b;
    b.input("x", {1, 2, 6, 6}).output("y", {1, 2, 6, 6});
    auto ramp = [](size_t n, float step, int period) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = step * static_cast<float>(static_cast<int>(i * 7 % period) - period / 2);
        return v;
    };
    b.initializer("w1", Tensor::from_values<float>({4, 2, 3, 3}, ramp(72, 0.07f, 13)));
    b.initializer("w2", Tensor::from_values<float>({2, 4, 1, 1}, ramp(8, 0.3f, 5)));
    b.initializer("t", Tensor::from_values<float>({6, 6, 2, 1}, ramp(72, 0.11f, 17)));
    vaiq::set_attribute(b.node("Conv", {"x", "w1"}, {"c1"}), "pads", std::vector<int64_t>{1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r1"});
    b.node("Conv", {"r1", "w2"}, {"c2"});
    vaiq::set_attribute(b.node("Transpose", {"t"}, {"s"}), "perm", std::vector<int64_t>{3, 2, 0, 1});
    b.node("Mul", {"c2", "s"}, {"y"});
    const auto model = b.build();
    auto params = [](vaiq::QuantType type, float scale, int64_t zero_point) {
        return vaiq::QuantParams(type, {scale}, {zero_point});
    };
    vaiq::QuantPlan plan;
    using vaiq::QuantType, vaiq::TensorRole;
    plan.tensors.push_back({"x", TensorRole::Activation, {}, params(QuantType::QUInt8, 1.0f / 255, 0)});
    plan.tensors.push_back({"w1", TensorRole::Weight, {}, params(QuantType::QInt8, 0.43f / 127, 0)});
    plan.tensors.push_back({"r1", TensorRole::Activation, {}, params(QuantType::QUInt8, 0.02f, 0)});
    plan.tensors.push_back({"w2", TensorRole::Weight, {}, params(QuantType::QInt8, 0.6f / 127, 0)});
    plan.tensors.push_back({"c2", TensorRole::Activation, {}, params(QuantType::QInt8, 0.03f, 3)});
    plan.tensors.push_back({"t", TensorRole::Weight, {}, params(QuantType::QInt8, 0.9f / 127, 0)});
    // A fitted w2: rounded otherwise than to nearest, as an algorithm may.
    const std::map<std::string, Tensor> fitted = {{"w2", Tensor::from_values<float>({2, 4, 1, 1}, ramp(8, 0.31f, 5))}};
    auto emit = [&](const vaiq::QuantPlan& alone, const std::map<std::string, Tensor>& weights) {
        vaiq::Model out = model;
        for (auto& init : *out.graph().mutable_initializer())
            if (auto it = weights.find(init.name()); it != weights.end()) init = it->second.to_proto(init.name());
        QdqPairs().emit(out, alone, {});
        return out;
    };
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 4, 7);
    const auto reference = vaiq::reference_batches(model, *data, 0, 0, 1);
    vaiq::BatchThreads split{1, 1};
    vaiq::AlgorithmInputs in(model, plan, *data, 1);
    in.fitted_weights = [&] { return fitted; };
    in.emit = emit;
    in.agreement = [&](const vaiq::Model& candidate, int, vaiq::Batches) {
        return vaiq::measure_output(candidate, reference, 1);
    };
    in.agreements = [&](size_t variants, const vaiq::Model&, const std::function<vaiq::VariantRun(int)>& make_run, int,
                        vaiq::Batches, std::optional<size_t> own) {
        return vaiq::measure_outputs(variants, make_run, split, reference, own);
    };
    vaiq::HostAlgorithmContext context(std::move(in));
    vaiq::RankingOptions options;
    options.output_index = 0;
    options.batches = 0;
    options.max_tensors = 0;
    const auto ranking = vaiq::rank_tensors(context, options);
    ASSERT_EQ(ranking.size(), plan.tensors.size());
    // Two batches at a time, a runner each, add up in their order: the same figures to the bit.
    split = {2, 1};
    const auto two_at_once = vaiq::rank_tensors(context, options);
    ASSERT_EQ(two_at_once.size(), ranking.size());
    for (size_t i = 0; i < ranking.size(); ++i) {
        EXPECT_EQ(two_at_once[i].tensor, ranking[i].tensor);
        EXPECT_EQ(two_at_once[i].output_sqnr_db, ranking[i].output_sqnr_db) << ranking[i].tensor;
    }
    split = {1, 1};
    for (const auto& s : ranking) {
        vaiq::QuantPlan alone;
        alone.tensors.push_back(*plan.find(s.tensor));
        std::map<std::string, Tensor> weights;
        if (auto it = fitted.find(s.tensor); it != fitted.end()) weights.insert(*it);
        const double whole = vaiq::measure_output(emit(alone, weights), reference, 1).sqnr_db;
        ASSERT_TRUE(s.output_sqnr_db.has_value()) << s.tensor;
        EXPECT_LT(whole, 80.0) << s.tensor << " costs the output something";
        EXPECT_NEAR(*s.output_sqnr_db, whole, 0.01) << s.tensor;
    }

    // Only the two whose own error is largest measured: they lead, with their
    // figures as before; the rest follow by their own error, unmeasured.
    options.max_tensors = 2;
    const auto limited = vaiq::rank_tensors(context, options);
    ASSERT_EQ(limited.size(), plan.tensors.size());
    std::vector<std::pair<double, std::string>> by_own;
    for (const auto& s : ranking) by_own.emplace_back(s.tensor_sqnr_db.value(), s.tensor);
    std::sort(by_own.begin(), by_own.end());
    const std::set<std::string> worst_own = {by_own[0].second, by_own[1].second};
    for (size_t i = 0; i < limited.size(); ++i) {
        const auto& s = limited[i];
        EXPECT_EQ(s.output_sqnr_db.has_value(), i < 2) << s.tensor;
        if (i < 2) {
            EXPECT_TRUE(worst_own.count(s.tensor)) << s.tensor;
            const auto full =
                std::find_if(ranking.begin(), ranking.end(), [&](auto& r) { return r.tensor == s.tensor; });
            EXPECT_DOUBLE_EQ(*s.output_sqnr_db, *full->output_sqnr_db) << s.tensor;
        } else if (i > 2) {
            EXPECT_LE(limited[i - 1].tensor_sqnr_db.value(), s.tensor_sqnr_db.value()) << "by their own error";
        }
    }
}

// With a top-1 target, a greedy search whose candidates' single gains together
// cannot reach the best prefix does not start. 100 rows of four classes, class
// 1 ahead of class 0 by 0.01, 0.02, ..., 1.0; the candidate adds the error left
// to class 0, so a row agrees while its lead is above the error. Raising the
// ten together takes the error from 0.9 to 0.3 (70 rows agree, from 10); each
// alone removes 0.02 / k, two rows at most.
TEST(MixedPrecisionSearch, AGreedySearchWhoseSingleGainsCannotReachThePrefixDoesNotStart) {
    std::vector<float> x;
    for (int r = 0; r < 100; ++r)
        for (const float v : {0.0f, static_cast<float>(r + 1) / 100.0f, -1.0f, -1.0f}) x.push_back(v);
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    const auto rows = Tensor::from_values<float>({100, 4}, x);
    reference.feeds.push_back({{"x", rows}});
    reference.outputs.push_back({rows});
    const ShrinkingGains tensors;
    const auto& [ranking, removes] = tensors;
    auto measured = std::make_shared<std::array<int, 4>>();
    const auto raise = raising_on(
        reference,
        [&](const std::set<std::string>& raised) {
            float error = 0.9f;
            for (const auto& t : raised) error -= removes.at(t);
            if (raised.size() == removes.size()) error = 0.3f;
            GraphBuilder b;
            b.input("x", {100, 4}).output("y", {100, 4});
            b.initializer("e", Tensor::from_values<float>({4}, std::vector<float>{error, 0, 0, 0}));
            b.node("Add", {"x", "e"}, {"y"});
            return b.build();
        },
        measured);
    vaiq::MixedPrecisionTarget target;
    target.top1_drop = 0.01;  // out of reach: 99 rows
    const auto result = vaiq::search_mixed_precision(
        target, [&] { return ranking; }, raise, 10);
    EXPECT_EQ(result.raised.size(), 10u) << "the prefix";
    EXPECT_NEAR(result.report["after"]["top1_agreement"].get<double>(), 0.7, 1e-9) << result.report.dump();
    for (const auto& t : result.report["tried"]) EXPECT_NE(t.value("search", ""), "greedy") << t.dump();
    EXPECT_EQ((*measured)[static_cast<size_t>(vaiq::BatchSet::Screening)], 10) << "screened once, then no step";
}
