#include "mixed_precision.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

bool MixedPrecisionTarget::met_by(const OutputAgreement& e) const {
    if (sqnr_db && !(e.sqnr_db >= *sqnr_db)) return false;
    if (l2 && !(e.relative_l2 <= *l2)) return false;
    if (top1_drop && !(e.top1_agreement >= 1.0 - *top1_drop)) return false;
    return true;
}

double MixedPrecisionTarget::score(const OutputAgreement& e) const {
    if (top1_drop) return e.top1_agreement;
    if (sqnr_db) return e.sqnr_db;
    return -e.relative_l2;
}

double MixedPrecisionTarget::threshold() const {
    if (top1_drop) return 1.0 - *top1_drop;
    if (sqnr_db) return *sqnr_db;
    return l2 ? -*l2 : 0.0;
}

std::string MixedPrecisionTarget::describe() const {
    std::vector<std::string> parts;
    if (sqnr_db) parts.push_back(fmt::format("SQNR >= {} dB", *sqnr_db));
    if (l2) parts.push_back(fmt::format("relative L2 <= {}", *l2));
    if (top1_drop) parts.push_back(fmt::format("top-1 agreement >= {}", 1.0 - *top1_drop));
    std::string out;
    for (const auto& part : parts) out += (out.empty() ? "" : " and ") + part;
    return out;
}

nlohmann::json error_json(const OutputAgreement& e) {
    return {{"sqnr_db", std::isinf(e.sqnr_db) ? nlohmann::json("inf") : nlohmann::json(e.sqnr_db)},
            {"relative_l2", e.relative_l2},
            {"top1_agreement", e.top1_agreement}};
}

namespace {

// When no prefix of the ranking reaches the target, the tensors' costs do not
// add up (errors compound, and some cancel): each step then raises the
// candidate that improves the output most given those already raised. Gains
// are re-measured lazily: every candidate once, on the Screening batches (a
// third of the searched ones), then each step only the few whose last
// measured gain is highest, on the Searched batches (a gain mostly shrinks as
// others are raised, so the best of those is nearly always the best of all).
// `to_beat`: the best prefix of the ranking measured (kept unless the search beats it).
std::optional<std::pair<std::set<std::string>, OutputAgreement>> raise_greedily(
    const MixedPrecisionTarget& target, const std::vector<std::string>& ranked, const Raising& raise, size_t budget,
    const OutputAgreement& none, const OutputAgreement& to_beat,
    const std::function<bool(const OutputAgreement&, const OutputAgreement&)>& better, nlohmann::json& tried) {
    constexpr size_t kRemeasured = 6;
    // When no candidate measurably helps any more, the candidates are screened
    // again on top of those raised, but only those whose last estimate was best:
    // on the PP-OCRv4 recognizer each such step's winner had been within the first
    // 22 of 88 by its last estimate, and screening all 88 cost 11 s a step.
    constexpr size_t kRescreened = 32;
    // The most harmful alone, twice as many as the budget holds and a few more.
    std::vector<std::string> pool(
        ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(std::min(ranked.size(), 2 * budget + 8)));
    struct Candidate {
        std::string tensor;
        OutputAgreement error;  // with it raised on top of those raised when measured
        size_t measured_at = 0;
        bool screened = false;  // measured on fewer batches than the searched ones
    };
    std::set<std::string> raised;
    OutputAgreement current = none;
    std::vector<std::pair<double, size_t>> steps{{target.score(none), 0}};  // score and tensors raised, per step
    // Where the search's time goes, for the debug log.
    struct Cost {
        size_t count = 0;
        double seconds = 0;
    } measured, estimated;
    auto timed = [](Cost& cost, size_t count, const auto& work) {
        const auto start = std::chrono::steady_clock::now();
        work();
        cost.count += count;
        cost.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    auto measure = [&](Candidate& c, size_t step, BatchSet batches) {
        auto with = raised;
        with.insert(c.tensor);
        timed(measured, 1, [&] { c.error = raise.measure(with, batches); });
        c.measured_at = step;
        c.screened = c.error.batches < none.batches;
    };
    // A first look at several candidates: estimated at once where the search
    // can, else each measured on the Screening batches.
    auto screen = [&](const std::vector<Candidate*>& some, size_t step) {
        std::vector<std::string> tensors;
        for (const auto* c : some) tensors.push_back(c->tensor);
        Estimates estimates;
        if (raise.screen)
            timed(estimated, some.size(), [&] { estimates = raise.screen(raised, tensors, BatchSet::Screening); });
        estimates.raised.resize(some.size());
        for (size_t i = 0; i < some.size(); ++i) {
            if (raise.progress)
                raise.progress("candidate", static_cast<int64_t>(i) + 1, static_cast<int64_t>(some.size()));
            if (!estimates.base || !estimates.raised[i]) {
                measure(*some[i], step, BatchSet::Screening);
                continue;
            }
            // The estimated change, applied to the measured state.
            const auto& e = *estimates.raised[i];
            auto& error = some[i]->error;
            error = current;
            error.sqnr_db += e.sqnr_db - estimates.base->sqnr_db;
            error.relative_l2 += e.relative_l2 - estimates.base->relative_l2;
            error.top1_agreement += e.top1_agreement - estimates.base->top1_agreement;
            error.sequence_agreement += e.sequence_agreement - estimates.base->sequence_agreement;
            some[i]->measured_at = step;
            some[i]->screened = true;
        }
    };
    // Measured on the searched batches with those raised now: comparable with `current`.
    auto fresh = [](const Candidate& c, size_t step) { return c.measured_at == step && !c.screened; };
    std::vector<Candidate> candidates;
    log_info("mixed precision: out of reach by the ranking; measuring {} candidates in turn", pool.size());
    for (const auto& tensor : pool)
        if (raise.count({tensor}) <= budget) candidates.push_back({tensor, {}, 0, false});
    {
        std::vector<Candidate*> all;
        for (auto& c : candidates) all.push_back(&c);
        screen(all, 0);
    }
    // Gains shrink as tensors are raised (as the stop rule below assumes): the
    // search cannot gain more than the best single gains of this first
    // screening together, one a tensor of the budget. Where those cannot lift
    // the output to the best prefix of the ranking, which it must beat to be
    // kept, it ends before its first step. Only for a top-1 target: single
    // gains in SQNR or L2 add up to less than raising the tensors together
    // removes. On the PP-OCRv4 detector (cpu_accurate: 0.034 against 0.063;
    // transformer_npu_accurate: 0.029 against 0.044) the greedy search had
    // taken three and nine steps without reaching the prefix.
    if (target.top1_drop) {
        std::vector<double> gains;
        for (const auto& c : candidates) gains.push_back(std::max(0.0, target.score(c.error) - target.score(none)));
        std::sort(gains.rbegin(), gains.rend());
        gains.resize(std::min(gains.size(), budget));
        const double reachable = target.score(none) + std::accumulate(gains.begin(), gains.end(), 0.0);
        if (reachable < target.score(to_beat)) {
            log_info(
                "mixed precision: the greedy search does not start: its candidates' best {} gains together reach "
                "{:.4g}, short of the best prefix of the ranking ({:.4g})",
                gains.size(), reachable, target.score(to_beat));
            return std::nullopt;
        }
    }
    // Re-measures the best by its last gain until the best is fresh, or
    // kRemeasured have been (then the fresh ones first, best first).
    auto settle = [&](size_t step) {
        for (size_t remeasured = 0;; ++remeasured) {
            std::stable_sort(candidates.begin(), candidates.end(),
                             [&](const Candidate& a, const Candidate& b) { return better(a.error, b.error); });
            if (fresh(candidates.front(), step)) return;
            if (remeasured >= kRemeasured) break;
            measure(candidates.front(), step, BatchSet::Searched);
        }
        std::stable_sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
            if (fresh(a, step) != fresh(b, step)) return fresh(a, step);
            return better(a.error, b.error);
        });
    };
    for (size_t step = 0; !target.met_by(current); ++step) {
        // Those the budget no longer holds drop out.
        std::erase_if(candidates, [&](const Candidate& c) {
            auto with = raised;
            with.insert(c.tensor);
            return raise.count(with) > budget;
        });
        if (candidates.empty()) break;
        settle(step);
        if (!better(candidates.front().error, current) || !fresh(candidates.front(), step)) {
            // Before giving up, the most promising others are screened again on
            // top of those raised now (candidates are in order of their last
            // estimate), and the best of them measured.
            std::vector<Candidate*> stale;
            for (auto& c : candidates)
                if (!fresh(c, step) && stale.size() < kRescreened) stale.push_back(&c);
            screen(stale, step);
            settle(step);
        }
        // Stop when no candidate measurably helps: past that point each step
        // would follow the measurement's noise on the calibration data (tried:
        // going on to the budget fitted it and read fewer held-out lines).
        const auto& best = candidates.front();
        if (!fresh(best, step) || !better(best.error, current)) break;
        raised.insert(best.tensor);
        const size_t count = raise.count(raised);
        current = best.error;
        auto j = error_json(current);
        j["tensors_raised"] = count;
        j["search"] = "greedy";
        tried.push_back(j);
        log_info("mixed precision: greedy step {}: raised {} ({} tensors): SQNR {:.2f} dB, top-1 agreement {:.4f}",
                 step + 1, best.tensor, count, current.sqnr_db, current.top1_agreement);
        candidates.erase(candidates.begin());
        // Gains shrink as tensors are raised (the most helpful go first): once the
        // larger of the last two steps' gains per tensor, over what the budget
        // still holds, reaches neither the target nor, while the search is below
        // it, the best prefix measured (kept then), it stops. Past that point a
        // step buys a fraction of a percent of agreement for several seconds, and
        // a raised tensor costs the deployed model (float on an NPU target: a
        // partition). On the PP-OCRv4 detector (cnn_npu_accurate.yaml) four more
        // steps after it passed its prefix took 0.911 to 0.916 of a target of 0.99 in 36 s.
        steps.emplace_back(target.score(current), count);
        if (steps.size() >= 3) {
            double rate = 0;
            for (size_t k = steps.size() - 2; k < steps.size(); ++k)
                rate =
                    std::max(rate, (steps[k].first - steps[k - 1].first) /
                                       static_cast<double>(std::max<size_t>(1, steps[k].second - steps[k - 1].second)));
            const double reachable = steps.back().first + rate * static_cast<double>(budget - std::min(budget, count));
            const bool below_prefix = !better(current, to_beat);
            const double goal = below_prefix ? std::min(target.threshold(), target.score(to_beat)) : target.threshold();
            if (reachable < goal) {
                log_info(
                    "mixed precision: the greedy search stops: at {:.3g} a tensor it would reach {:.4g} within the "
                    "budget, short of {} ({:.4g})",
                    rate, reachable, goal == target.threshold() ? "the target" : "the best prefix of the ranking",
                    goal);
                break;
            }
        }
    }
    log_debug("mixed precision: the greedy search estimated {} candidates in {:.1f} s and measured {} in {:.1f} s",
              estimated.count, estimated.seconds, measured.count, measured.seconds);
    if (raised.empty()) return std::nullopt;
    return std::make_pair(raised, current);
}

}  // namespace

MixedPrecisionResult search_mixed_precision(const MixedPrecisionTarget& target, const Ranker& rank,
                                            const Raising& raise, size_t budget) {
    std::vector<TensorSensitivity> ranking;
    std::vector<std::string> candidates;
    auto prefix = [&](size_t k) {
        return std::set<std::string>(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k));
    };
    size_t longest = 0;  // the longest prefix within the budget
    // The ranking costs an inference per tensor: it is computed only once the
    // quantized model is known to miss the target somewhere.
    bool is_ranked = false;
    auto ranked = [&] {
        if (std::exchange(is_ranked, true)) return;
        ranking = rank();
        for (const auto& s : ranking)  // only tensors whose quantization costs anything
            if (s.output_sqnr_db && !std::isinf(*s.output_sqnr_db)) candidates.push_back(s.tensor);
        while (longest < candidates.size() && raise.count(prefix(longest + 1)) <= budget) ++longest;
    };

    nlohmann::json tried = nlohmann::json::array();
    std::map<size_t, OutputAgreement> errors;  // by prefix length
    auto error_at = [&](size_t k) -> const OutputAgreement& {
        if (auto it = errors.find(k); it != errors.end()) return it->second;
        const auto raised = prefix(k);
        const auto e = raise.measure(raised, BatchSet::Searched);
        auto j = error_json(e);
        j["tensors_raised"] = raise.count(raised);
        tried.push_back(j);
        log_info("mixed precision: {} tensors raised: SQNR {:.2f} dB, top-1 agreement {:.4f}", raise.count(raised),
                 e.sqnr_db, e.top1_agreement);
        return errors.emplace(k, e).first->second;
    };
    auto met = [&](size_t k) { return target.met_by(error_at(k)); };

    // Top-1 agreements a row or two apart are ties (one row of 1280 is noise
    // of the calibration data, not a better set): the better SQNR decides them.
    auto better = [&](const OutputAgreement& a, const OutputAgreement& b) {
        constexpr double kTiedRows = 2;
        const double tie = target.top1_drop ? kTiedRows / static_cast<double>(std::max<int64_t>(a.rows, 1)) : 0.0;
        const double da = target.score(a), db = target.score(b);
        return da > db + tie || (std::abs(da - db) <= tie && a.sqnr_db > b.sqnr_db);
    };
    size_t chosen = 0;
    std::optional<std::pair<std::set<std::string>, OutputAgreement>> greedy;
    if (!met(0)) {
        ranked();
        size_t fail = 0, k = 1;
        while (k < longest && !met(k)) {
            fail = k;
            k *= 2;
        }
        k = std::min(k, longest);
        if (k > fail && met(k)) {
            while (k - fail > 1) {  // met at k, not at fail
                const size_t mid = (fail + k) / 2;
                (met(mid) ? k : fail) = mid;
            }
            chosen = k;
        } else {  // out of reach: the error need not fall with every tensor raised
            for (const auto& [length, error] : errors)
                if (better(error, errors.at(chosen))) chosen = length;
            greedy = raise_greedily(target, candidates, raise, budget, error_at(0), errors.at(chosen), better, tried);
        }
    }
    auto raised = prefix(chosen);
    OutputAgreement last = error_at(chosen);
    if (greedy && better(greedy->second, last)) raised = greedy->first, last = greedy->second;
    bool reached = target.met_by(last);
    // The choice confirmed on the held-out batches; where it meets the target
    // only on the batches it was chosen on, longer prefixes of the ranking are
    // tried (within the budget) until it meets it on both.
    nlohmann::json confirmation;
    auto confirm = reached ? raise.measure(raised, BatchSet::HeldOut) : OutputAgreement{};
    if (confirm.batches > 0) {
        if (!target.met_by(confirm)) ranked();
        for (size_t k = std::max<size_t>(chosen, 1) * 2; !target.met_by(confirm) && k / 2 < longest; k *= 2) {
            const auto longer = prefix(std::min(k, longest));
            const auto on_search = raise.measure(longer, BatchSet::Searched);
            if (!target.met_by(on_search)) continue;
            const auto on_held = raise.measure(longer, BatchSet::HeldOut);
            log_info("mixed precision: {} tensors raised to carry to the held-out batches: top-1 agreement {:.4f} "
                     "there",
                     raise.count(longer), on_held.top1_agreement);
            raised = longer, last = on_search, confirm = on_held;
        }
        confirmation = error_json(confirm);
        confirmation["batches"] = confirm.batches;
        confirmation["met"] = target.met_by(confirm);
        if (!target.met_by(confirm)) {
            reached = false;
            log_warn("mixed precision: the target ({}) holds on the batches the search measured but not on the {} "
                     "held out of it (SQNR {:.2f} dB, top-1 agreement {:.4f}): the choice may not carry to other "
                     "data; more calibration data or a larger MaxRaisedFraction help",
                     target.describe(), confirm.batches, confirm.sqnr_db, confirm.top1_agreement);
        }
    }
    MixedPrecisionResult out;
    out.raised = raised;
    out.report = {{"target", target.describe()},
                  {"output", raise.output.name},
                  {"measure", raise.output.measure},
                  {"batches", error_at(0).batches},
                  {"budget", budget},
                  {"met", reached},
                  {"before", error_json(error_at(0))},
                  {"after", error_json(last)},
                  {"tensors_raised", raise.count(raised)},
                  {"raised", nlohmann::json::array()},
                  {"tried", tried}};
    if (!confirmation.is_null()) out.report["held_out"] = confirmation;
    for (const auto& s : ranking)
        if (raised.count(s.tensor))
            out.report["raised"].push_back(
                {{"tensor", s.tensor}, {"role", role_name(s.role)}, {"output_sqnr_db_alone", *s.output_sqnr_db}});
    if (!reached && (confirmation.is_null() || confirmation["met"].get<bool>()))
        log_warn(
            "mixed precision: the target ({}) is out of reach within the budget (MaxRaisedFraction: {} tensors); "
            "the best tried raises {}: SQNR {:.2f} dB, top-1 agreement {:.4f}",
            target.describe(), budget, raise.count(raised), last.sqnr_db, last.top1_agreement);
    return out;
}

}  // namespace vaiq
