// The `html` report: the run's report as one self-contained page (inline CSS
// and SVG, no script, nothing fetched): what a person reads to see which
// layers lost what. Summary (float vs quantized accuracy and SQNR), per-tensor
// error sorted by harm, activation histograms with the chosen ranges,
// sensitivity when measured, the plan, device adjustments, passes, phase times
// and the explicit settings.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <vector>

#include "vaiq/report.hpp"

namespace vaiq {

namespace {

using nlohmann::json;

std::string escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&#39;"; break;
            default: out += c;
        }
    }
    return out;
}

// Long tensor names are cut in the middle, where exporters repeat themselves.
std::string shorten(const std::string& name, size_t limit = 44) {
    if (name.size() <= limit) return name;
    const size_t keep = (limit - 1) / 2;
    return name.substr(0, keep) + "\u2026" + name.substr(name.size() - keep);
}

std::string file_name(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

std::string number(const json& v, int digits = 4) {
    if (!v.is_number()) return v.is_null() ? "\u2013" : escape(v.dump());
    return fmt::format("{:.{}g}", v.get<double>(), digits);
}

// A member by reference (no copy), or an empty value when absent.
const json& member(const json& j, const char* key) {
    static const json kNone;
    if (!j.is_object()) return kNone;
    auto it = j.find(key);
    return it == j.end() ? kNone : *it;
}

// A boolean or number member, or `fallback` when absent or of another type.
template <typename T>
T value_or(const json& j, const char* key, T fallback) {
    const json& v = member(j, key);
    if constexpr (std::is_same_v<T, bool>)
        return v.is_boolean() ? v.get<bool>() : fallback;
    else
        return v.is_number() ? v.get<T>() : fallback;
}

std::string str(const json& j, const char* key, const char* fallback = "") {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// Below warn_output_sqnr_db the pipeline warns; 20 and 30 dB are where int8
// models usually lose and keep their accuracy.
const char* sqnr_colour(double db, double warn_db) {
    if (db < warn_db) return "#c62828";
    if (db < 20) return "#ef6c00";
    if (db < 30) return "#f9a825";
    return "#2e7d32";
}

struct Bar {
    std::string label, title;
    double value;
    std::string colour, text;
};

// A horizontal bar chart, one row per bar, scaled to `scale_max`.
std::string bar_chart(const std::vector<Bar>& bars, double scale_min, double scale_max, const std::string& unit) {
    constexpr int kLabel = 300, kPlot = 420, kRow = 18, kPad = 60;
    const int height = static_cast<int>(bars.size()) * kRow + 24;
    const double span = std::max(scale_max - scale_min, 1e-9);
    std::string svg = fmt::format("<svg class=\"chart\" role=\"img\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\">",
                                  kLabel + kPlot + kPad, height, kLabel + kPlot + kPad, height);
    for (int tick = 0; tick <= 4; ++tick) {
        const double x = kLabel + kPlot * tick / 4.0;
        svg += fmt::format("<line x1=\"{:.1f}\" y1=\"0\" x2=\"{:.1f}\" y2=\"{}\" class=\"grid\"/>", x, x, height - 18);
        svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tick\">{:.3g}{}</text>", x, height - 4,
                           scale_min + span * tick / 4, tick == 4 ? " " + unit : "");
    }
    for (size_t i = 0; i < bars.size(); ++i) {
        const auto& b = bars[i];
        const double y = static_cast<double>(i) * kRow;
        const double w = std::clamp((b.value - scale_min) / span, 0.0, 1.0) * kPlot;
        svg += fmt::format(
            "<g><title>{}</title><text x=\"{}\" y=\"{:.1f}\" class=\"label\">{}</text>"
            "<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>"
            "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"value\">{}</text></g>",
            escape(b.title), kLabel - 6, y + 13, escape(b.label), kLabel, y + 3, std::max(w, 1.0), kRow - 5, b.colour,
            kLabel + w + 4, y + 13, escape(b.text));
    }
    return svg + "</svg>";
}

// Where a chart of dB values starts: 0, or below the lowest value in steps of 10
// (an output or tensor below 0 dB still draws a bar).
double chart_floor(double lowest) { return std::min(0.0, std::floor(lowest / 10) * 10); }

// Each quantized activation's SQNR in graph order, as a line: where the error
// starts to grow is what a reader looks for. The warning threshold is drawn.
std::string graph_order_svg(const json& tensors, double warn_db) {
    std::vector<std::pair<std::string, double>> points;
    double lo = 0, hi = 40;
    for (const auto& t : tensors) {
        if (!t["sqnr_db"].is_number()) continue;  // exact
        const double db = t["sqnr_db"].get<double>();
        points.emplace_back(str(t, "tensor"), db);
        lo = std::min(lo, db), hi = std::max(hi, db);
    }
    if (points.size() < 2) return {};
    lo = chart_floor(lo), hi = std::ceil(hi / 10) * 10;
    constexpr double kW = 720, kH = 180, kLeft = 40, kBottom = 20;
    const double plot_w = kW - kLeft - 10, plot_h = kH - kBottom - 8;
    auto x_of = [&](size_t i) {
        return kLeft + plot_w * static_cast<double>(i) / static_cast<double>(points.size() - 1);
    };
    auto y_of = [&](double db) { return 8 + plot_h * (1 - (db - lo) / (hi - lo)); };
    std::string svg = fmt::format(
        "<svg class=\"chart\" role=\"img\" id=\"graph-order\" viewBox=\"0 0 {} {}\" "
        "width=\"{}\" height=\"{}\">",
        kW, kH, kW, kH);
    for (int tick = 0; tick <= 4; ++tick) {
        const double db = lo + (hi - lo) * tick / 4, y = y_of(db);
        svg += fmt::format(
            "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" class=\"grid\"/>"
            "<text x=\"2\" y=\"{:.1f}\" class=\"tick\">{:.3g}</text>",
            kLeft, y, kW - 10, y, y + 4, db);
    }
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#c0392b\" "
        "stroke-dasharray=\"4 3\"><title>warn_output_sqnr_db {}</title></line>",
        kLeft, y_of(warn_db), kW - 10, y_of(warn_db), warn_db);
    std::string path;
    for (size_t i = 0; i < points.size(); ++i)
        path += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", x_of(i), y_of(points[i].second));
    svg += "<polyline fill=\"none\" stroke=\"#2c6fbb\" stroke-width=\"1.5\" points=\"" + path + "\"/>";
    for (size_t i = 0; i < points.size(); ++i)
        svg += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"><title>{}: {:.1f} dB</title>"
            "</circle>",
            x_of(i), y_of(points[i].second), sqnr_colour(points[i].second, warn_db), escape(points[i].first),
            points[i].second);
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" class=\"tick\">first quantized tensor</text>"
        "<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">last (dB)</text>",
        kLeft, kH - 4, kW - 10, kH - 4);
    return svg + "</svg>";
}

// A value histogram (log counts) with the calibrated range drawn as two lines.
std::string histogram_svg(const json& h, const std::array<double, 2>& range) {
    constexpr double kW = 300, kH = 110, kBase = 92;
    const double lo = h["min"].get<double>(), hi = h["max"].get<double>();
    const auto counts = h["counts"].get<std::vector<int64_t>>();
    double top = 1;
    for (auto c : counts) top = std::max(top, std::log1p(static_cast<double>(c)));
    std::string svg = fmt::format("<svg class=\"hist\" role=\"img\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\">",
                                  kW, kH, kW, kH);
    const double bin_w = kW / static_cast<double>(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) {
        if (counts[i] == 0) continue;
        const double bh = std::log1p(static_cast<double>(counts[i])) / top * (kBase - 6);
        svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" class=\"bin\"/>",
                           i * bin_w, kBase - bh, std::max(bin_w - 0.5, 0.5), bh);
    }
    auto x_of = [&](double v) { return (v - lo) / (hi - lo) * kW; };
    for (double edge : range)
        svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"2\" x2=\"{0:.1f}\" y2=\"{1}\" class=\"range\"/>",
                           std::clamp(x_of(edge), 1.0, kW - 1), kBase);
    svg += fmt::format("<line x1=\"0\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" class=\"axis\"/>", kBase, kW);
    svg += fmt::format("<text x=\"0\" y=\"{}\" class=\"tick\">{:.4g}</text>", kH - 4, lo);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{:.4g}</text>", kW, kH - 4, hi);
    return svg + "</svg>";
}

std::string table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
    std::string out = "<table><thead><tr>";
    for (const auto& h : head) out += "<th>" + escape(h) + "</th>";
    out += "</tr></thead><tbody>";
    for (const auto& row : rows) {
        out += "<tr>";
        for (const auto& cell : row) out += "<td>" + cell + "</td>";  // cells are escaped by their makers
        out += "</tr>";
    }
    return out + "</tbody></table>";
}

std::string card(const std::string& title, const std::string& value, const std::string& note = "") {
    return fmt::format(
        "<div class=\"card\"><div class=\"card-title\">{}</div><div class=\"card-value\">{}</div>"
        "<div class=\"card-note\">{}</div></div>",
        escape(title), value, note);
}

std::string percent(const json& v) { return v.is_number() ? fmt::format("{:.2f} %", 100 * v.get<double>()) : "\u2013"; }

std::string summary_section(const json& report, double warn_db) {
    std::string out = "<section id=\"summary\"><h2>Summary</h2><div class=\"cards\">";
    const auto& model = member(report, "model");
    out +=
        card("Model", escape(shorten(file_name(str(model, "input")), 40)),
             fmt::format("{} nodes \u2192 {} after quantization, {} tensors quantized", number(member(model, "nodes")),
                         number(member(model, "nodes_after")), number(member(model, "quantized_tensors"))));
    const auto& settings = member(member(report, "recipe"), "settings");
    auto setting = [&](const char* key) {
        return settings.contains(key) ? escape(member(settings[key], "value").dump()) : std::string("\u2013");
    };
    out += card("Recipe", escape(str(member(report, "recipe"), "name", "(unnamed)")),
                fmt::format("target {}, {}, {}, activations {}, weights {}", setting("target"), setting("quant_format"),
                            setting("calibrate_method"), setting("activation_type"), setting("weight_type")));
    if (report.contains("evaluation")) {
        const auto& e = report["evaluation"];
        if (e.contains("accuracy"))
            out +=
                card("Top-1 accuracy",
                     fmt::format("{} \u2192 {}", percent(e["accuracy"]["float"]), percent(e["accuracy"]["quantized"])),
                     fmt::format("float \u2192 quantized, {} samples", number(member(e, "samples"))));
        for (const auto& o : member(e, "outputs")) {
            const double db = value_or(o, "sqnr_db", 0.0);
            out += card(fmt::format("Output {}", escape(str(o, "name"))),
                        fmt::format("<span style=\"color:{}\">{:.2f} dB</span>", sqnr_colour(db, warn_db), db),
                        fmt::format("SQNR; cosine {}, max |error| {}, top-1 agreement {}",
                                    number(member(o, "cosine_similarity"), 5), number(member(o, "max_abs_error")),
                                    percent(member(o, "top1_agreement"))));
        }
        out += "</div><p class=\"note\">" +
               escape(fmt::format("Quantized against the {} on {} ({} samples).", str(e, "reference", "float model"),
                                  str(e, "data", "data"), number(member(e, "samples")))) +
               "</p>";
    } else {
        out += "</div><p class=\"note\">The run did not evaluate the quantized model (it stopped after " +
               escape(str(report, "stopped_after", "?")) + ").</p>";
    }
    return out + "</section>";
}

std::map<std::string, const json*> plan_by_tensor(const json& report) {
    std::map<std::string, const json*> out;
    for (const auto& t : member(report, "tensors")) out[str(t, "tensor")] = &t;
    return out;
}

std::string errors_section(const json& report, double warn_db) {
    const auto& tensors = member(member(report, "evaluation"), "tensors");
    if (tensors.empty()) return {};
    std::vector<const json*> sorted;
    for (const auto& t : tensors) sorted.push_back(&t);
    auto db_of = [](const json* t) {
        return (*t)["sqnr_db"].is_number() ? (*t)["sqnr_db"].get<double>() : std::numeric_limits<double>::infinity();
    };
    std::stable_sort(sorted.begin(), sorted.end(), [&](auto a, auto b) { return db_of(a) < db_of(b); });
    constexpr size_t kShown = 40;
    std::vector<Bar> bars;
    double top = 40, lowest = 0;
    for (size_t i = 0; i < std::min(kShown, sorted.size()); ++i) {
        const double db = db_of(sorted[i]);
        const std::string name = str(*sorted[i], "tensor");
        top = std::max(top, std::isfinite(db) ? db : 0);
        if (std::isfinite(db)) lowest = std::min(lowest, db);
        bars.push_back({shorten(name), fmt::format("{} (node {})", name, str(*sorted[i], "node")),
                        std::isfinite(db) ? db : top, sqnr_colour(db, warn_db),
                        std::isfinite(db) ? fmt::format("{:.1f} dB", db) : "exact"});
    }
    std::string out = "<section id=\"errors\"><h2>Error per tensor</h2><p class=\"note\">";
    out += escape(fmt::format(
        "Each quantized activation's SQNR in the quantized model against the float model on one batch: the error "
        "accumulated from the inputs up to that tensor. Lowest (most harmful) first{}.",
        sorted.size() > kShown ? fmt::format("; the {} worst of {}", kShown, sorted.size()) : ""));
    out += "</p>" + bar_chart(bars, chart_floor(lowest), std::ceil(top / 10) * 10, "dB");
    const std::string along = graph_order_svg(tensors, warn_db);
    if (!along.empty())
        out +=
            "<h3>Along the graph</h3><p class=\"note\">The same SQNR in graph order, the warning threshold dashed: "
            "where the line starts to fall is where the error begins.</p>" +
            along;
    const auto& sensitivity = tensor_ranking(report);
    if (!sensitivity.empty()) {
        std::vector<Bar> harm;
        double best = 40, worst = 0;
        for (size_t i = 0; i < std::min(kShown, sensitivity.size()); ++i) {
            const auto& s = sensitivity[i];
            const json& v = member(s, "output_sqnr_db");  // a number, "inf" (exact) or null (not measured)
            if (!v.is_number() && v != "inf") continue;
            const bool exact = !v.is_number();
            const double db = exact ? best : v.get<double>();
            best = std::max(best, db), worst = std::min(worst, db);
            harm.push_back({shorten(str(s, "tensor")), str(s, "tensor"), db, sqnr_colour(db, warn_db),
                            exact ? "exact" : fmt::format("{:.1f} dB ({})", db, str(s, "role"))});
        }
        out += "<h3>Sensitivity: the output's SQNR with only that tensor quantized</h3>" +
               bar_chart(harm, chart_floor(worst), std::ceil(best / 10) * 10, "dB");
    }
    return out + "</section>";
}

std::string histograms_section(const json& report) {
    const auto& tensors = member(member(report, "evaluation"), "tensors");
    if (tensors.empty()) return {};
    const auto plan = plan_by_tensor(report);
    std::string out =
        "<section id=\"histograms\"><h2>Activation histograms</h2><p class=\"note\">In graph order, the float values "
        "of each "
        "quantized activation on one batch (log counts), with the calibrated range it is quantized to in red: "
        "values outside it saturate, a range much wider than the values wastes levels.</p><div class=\"hists\">";
    for (const auto& t : tensors) {
        const std::string name = str(t, "tensor");
        auto it = plan.find(name);
        if (it == plan.end() || !it->second->contains("range")) continue;
        const auto& p = *it->second;
        const std::array<double, 2> range{p["range"][0].get<double>(), p["range"][1].get<double>()};
        std::string params = fmt::format("{} [{:.4g}, {:.4g}]", str(p, "type"), range[0], range[1]);
        if (p.contains("scale"))
            params +=
                fmt::format(", scale {:.4g}, zero point {}", p["scale"].get<double>(), number(member(p, "zero_point")));
        const std::string db =
            t["sqnr_db"].is_number() ? fmt::format("{:.1f} dB", t["sqnr_db"].get<double>()) : "exact";
        out += fmt::format(
            "<figure><figcaption title=\"{}\">{} <span class=\"db\">{}</span></figcaption>{}"
            "<div class=\"params\">{}</div></figure>",
            escape(name), escape(shorten(name, 38)), db, histogram_svg(t["histogram"], range), escape(params));
    }
    return out + "</div></section>";
}

std::string plan_section(const json& report) {
    const auto& tensors = member(report, "tensors");
    if (tensors.empty()) return {};
    std::vector<std::vector<std::string>> rows;
    for (const auto& t : tensors) {
        std::string scale, zero = number(member(t, "zero_point"));
        if (value_or(t, "dynamic", false)) {
            scale = "at run time";
        } else if (t.contains("axis")) {
            scale =
                fmt::format("{} \u2013 {} ({} channels, axis {})", number(member(t, "scale_min")),
                            number(member(t, "scale_max")), number(member(t, "channels")), number(member(t, "axis")));
        } else {
            scale = number(member(t, "scale"));
        }
        const std::string range =
            t.contains("range") ? fmt::format("[{}, {}]", number(t["range"][0]), number(t["range"][1])) : "\u2013";
        rows.push_back({"<code>" + escape(str(t, "tensor")) + "</code>", escape(str(t, "role")), escape(str(t, "type")),
                        scale, zero, range, value_or(t, "symmetric", false) ? "yes" : "no"});
    }
    return fmt::format("<section id=\"plan\"><h2>The plan</h2><details{}><summary>{} quantized tensors</summary>",
                       rows.size() <= 200 ? " open" : "", rows.size()) +
           table({"tensor", "role", "type", "scale", "zero point", "range", "symmetric"}, rows) +
           "</details></section>";
}

// What the plan left float on purpose, the tensors whose channels differ in
// scale and what was done about them, and the diagnoses that could not run.
// A box first on the page when an output is poor: which, where its error
// starts, and what to try (the run's "advice").
std::string advice_section(const json& report) {
    const auto& advice = member(report, "advice");
    if (advice.empty()) return {};
    std::vector<std::string> outputs;
    for (const auto& o : member(advice, "outputs"))
        outputs.push_back(fmt::format("<b>{}</b> {:.1f} dB", escape(str(o, "output")), value_or(o, "sqnr_db", 0.0)));
    std::string out = "<section id=\"advice\" class=\"advice\"><h2>The output is far from the float model's</h2><p>";
    for (size_t i = 0; i < outputs.size(); ++i) out += (i ? ", " : "") + outputs[i];
    out += escape(fmt::format(" (SQNR; warn_output_sqnr_db {}): {}.", number(member(advice, "warn_output_sqnr_db")),
                              str(advice, "where")));
    out += "</p><p>To try, most promising first:</p><ol>";
    for (const auto& t : member(advice, "try")) out += "<li>" + escape(t.get<std::string>()) + "</li>";
    return out + "</ol></section>";
}

std::string attention_section(const json& report) {
    const auto& kept = member(member(report, "plan"), "kept_float");
    const auto& notes = member(report, "notes");
    const auto& unavailable = member(report, "diagnoses_unavailable");
    if (kept.empty() && notes.empty() && unavailable.empty()) return {};
    std::string out = "<section id=\"attention\"><h2>Worth knowing</h2>";
    if (!kept.empty()) {
        std::vector<std::vector<std::string>> rows;
        for (const auto& k : kept)
            rows.push_back({"<code>" + escape(str(k, "tensor")) + "</code>", escape(str(k, "reason"))});
        out += "<h3>Left float on purpose</h3>" + table({"tensor", "why"}, rows);
    }
    if (!notes.empty()) {
        std::vector<std::vector<std::string>> rows;
        for (const auto& n : notes)
            rows.push_back(
                {"<code>" + escape(str(n, "tensor")) + "</code>", escape(str(n, "by")), escape(str(n, "note"))});
        out += "<h3>Notes from the algorithms</h3>" + table({"tensor", "algorithm", "note"}, rows);
    }
    if (!unavailable.empty()) {
        std::vector<std::vector<std::string>> rows;
        for (const auto& d : unavailable) rows.push_back({escape(str(d, "diagnosis")), escape(str(d, "error"))});
        out += "<h3>Diagnoses that could not be computed</h3>" + table({"diagnosis", "why"}, rows);
    }
    return out + "</section>";
}

std::string constraints_section(const json& report) {
    if (!report.contains("constraints") && !report.contains("constraints_written")) return {};
    std::map<std::string, std::vector<std::string>> rows;
    for (const auto& c : member(report, "constraints"))
        rows[str(c, "name")] = {escape(str(c, "name")), number(member(c, "checked")), number(member(c, "adjusted")),
                                number(member(c, "violated")), "\u2013"};
    for (const auto& c : member(report, "constraints_written")) {
        auto& row = rows[str(c, "name")];
        if (row.empty()) row = {escape(str(c, "name")), "\u2013", "\u2013", "\u2013", ""};
        row[4] = value_or(c, "violated", 0) == 0 ? "holds"
                                                 : fmt::format("<span class=\"bad\">broken on {} of {}</span>",
                                                               number(c["violated"]), number(member(c, "checked")));
    }
    std::vector<std::vector<std::string>> list;
    for (auto& [name, row] : rows) list.push_back(std::move(row));
    return "<section id=\"constraints\"><h2>Device limits</h2><p class=\"note\">What the target checked in the "
           "plan, how many places it adjusted to fit the device, and whether the written model holds.</p>" +
           table({"limit", "checked", "adjusted", "violated in the plan", "written model"}, list) + "</section>";
}

std::string phases_section(const json& report) {
    std::vector<Bar> bars;
    double total = 0, longest = 0;
    for (const auto& p : member(report, "phases")) {
        const double s = value_or(p, "seconds", 0.0);
        total += s;
        longest = std::max(longest, s);
        const double peak = value_or(p, "peak_mb", 0.0);
        bars.push_back({str(p, "name"), str(p, "name"), s, "#1565c0",
                        peak > 0 ? fmt::format("{:.3f} s, peak {:.0f} MB", s, peak) : fmt::format("{:.3f} s", s)});
    }
    if (bars.empty()) return {};
    std::string out =
        fmt::format("<section id=\"phases\"><h2>Phase times</h2><p class=\"note\">{:.2f} s in all.</p>", total);
    out += bar_chart(bars, 0, longest > 0 ? longest : 1, "s");
    std::vector<std::vector<std::string>> passes;
    for (const auto& p : member(report, "passes"))
        passes.push_back({escape(str(p, "name")), value_or(p, "changed", false) ? "changed the model" : "no change",
                          fmt::format("{:.3f} s", value_or(p, "seconds", 0.0))});
    if (!passes.empty()) out += "<h3>Preparation passes</h3>" + table({"pass", "result", "time"}, passes);
    return out + "</section>";
}

std::string settings_section(const json& report) {
    std::vector<std::vector<std::string>> rows;
    const auto& settings = member(member(report, "recipe"), "settings");
    for (const auto& [key, s] : settings.items()) {
        const std::string origin = str(s, "origin");
        if (origin == "default") continue;
        rows.push_back({"<code>" + escape(key) + "</code>", "<code>" + escape(member(s, "value").dump()) + "</code>",
                        escape(origin)});
    }
    if (rows.empty()) return {};
    return "<section id=\"settings\"><h2>Settings</h2><details><summary>" + std::to_string(rows.size()) +
           " settings that are not the documented defaults</summary>" + table({"key", "value", "set by"}, rows) +
           "</details></section>";
}

constexpr const char* kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1c2330;margin:0;background:#f5f6f8}
header{background:#1c2330;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header .sub{color:#b8c0cc;font-size:13px}main{padding:8px 32px 40px;max-width:1200px}
section{background:#fff;border-radius:8px;padding:4px 20px 16px;margin:16px 0;box-shadow:0 1px 2px #0002}
.advice{border-left:5px solid #c0392b}.advice h2{color:#c0392b}
h2{font-size:17px;margin:14px 0 8px}h3{font-size:14px;margin:16px 0 6px}.note{color:#555;margin:4px 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;min-width:200px;flex:1}
.card-title{color:#666;font-size:12px;text-transform:uppercase;letter-spacing:.04em}.card-value{font-size:20px;font-weight:600;margin:2px 0;word-break:break-all}
.card-note{color:#555;font-size:12px}table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceff3;vertical-align:top}th{background:#f0f2f5}
code{font-size:12px;word-break:break-all}.bad{color:#c62828;font-weight:600}summary{cursor:pointer;margin:6px 0}
svg text{font-size:11px;fill:#333}.label{text-anchor:end}.tick{fill:#777}.grid{stroke:#e3e6ea}
.grid+text{text-anchor:middle}.bin{fill:#5c7cfa}.range{stroke:#c62828;stroke-width:1.5;stroke-dasharray:4 2}.axis{stroke:#999}
.hist .tick{fill:#444}.chart{max-width:100%;height:auto}div.hists{display:grid;grid-template-columns:repeat(auto-fill,minmax(310px,1fr));gap:12px}
figure{margin:0;border:1px solid #eceff3;border-radius:6px;padding:6px}figcaption{font-size:12px;font-family:monospace;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.db{color:#666}.params{font-size:11px;color:#555}
)";

std::string page(const json& report) {
    const auto& recipe = member(report, "recipe");
    const double warn_db = value_or(member(member(recipe, "settings"), "warn_output_sqnr_db"), "value", 10.0);
    const auto& model = member(report, "model");
    const std::string title = model.contains("output") ? file_name(str(model, "output")) : "vaiq report";
    std::string html =
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        "<title>vaiq report: " +
        escape(title) + "</title><style>" + kStyle + "</style></head><body>";
    html += "<header><h1>" + escape(title) + "</h1><div class=\"sub\">" +
            escape(fmt::format("{}, quantized by vaiq {} from {}", str(model, "output", "?"),
                               str(report, "vaiq_version", "?"), str(model, "input", "?"))) +
            (value_or(report, "quantized", true) ? "" : " \u2014 not quantized: the run stopped early") +
            "</div></header><main>";
    html += advice_section(report);
    html += summary_section(report, warn_db);
    html += errors_section(report, warn_db);
    html += histograms_section(report);
    html += attention_section(report);
    html += constraints_section(report);
    html += plan_section(report);
    html += phases_section(report);
    html += settings_section(report);
    return html + "</main></body></html>\n";
}

class HtmlReport final : public ReportWriter {
  public:
    std::string extension() const override { return ".html"; }
    std::string render(const json& report) const override { return page(report); }
};

}  // namespace

}  // namespace vaiq

VAIQ_PLUGINS(vaiq::describe<vaiq::HtmlReport>("html", "1.0.0",
                                              "The report as one self-contained HTML page: per-tensor error, "
                                              "histograms with the chosen ranges, sensitivity, the plan, what to try"))
