// The html report plugin: its page from a report, and the page as Chromium renders it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "test_support.hpp"
#include "vaiq/report.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using vaiq::test::run_command;
using vaiq::test::slurp;

namespace {

// The page this test's plugin renders for `report`.
std::string html_report(const json& report) {
    static const auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Report, "html");
    const auto writer = registry.create<vaiq::ReportWriter>("html", registry.resolve_options(info, nullptr));
    EXPECT_EQ(writer->extension(), ".html");
    return writer->render(report);
}

json histogram() { return {{"min", -1.0}, {"max", 1.0}, {"counts", {1, 5, 0, 2}}}; }

json report_with(const std::string& bad_name) {
    return {{"vaiq_version", "0.1.0"},
            {"model", {{"input", "in.onnx"}, {"output", "out.onnx"}, {"nodes", 3}}},
            {"recipe", {{"name", "r"}, {"settings", {{"target", {{"value", "cpu"}, {"origin", "r.yaml:2:1"}}}}}}},
            {"tensors",
             {{{"tensor", "good"},
               {"role", "activation"},
               {"type", "QUInt8"},
               {"range", {-1, 1}},
               {"scale", 0.01},
               {"zero_point", 128}},
              {{"tensor", bad_name},
               {"role", "activation"},
               {"type", "QUInt8"},
               {"range", {-1, 1}},
               {"scale", 0.01},
               {"zero_point", 128}}}},
            {"evaluation",
             {{"samples", 4},
              {"outputs", {{{"name", "y"}, {"sqnr_db", 21.5}, {"cosine_similarity", 0.99}}}},
              {"tensors",
               {{{"tensor", "good"}, {"node", "n1"}, {"sqnr_db", 41.0}, {"histogram", histogram()}},
                {{"tensor", bad_name}, {"node", "n2"}, {"sqnr_db", 12.0}, {"histogram", histogram()}}}}}},
            {"phases", {{{"name", "load"}, {"seconds", 0.5}}}}};
}

}  // namespace

TEST(HtmlReport, EscapesWhatModelsAndRecipesNameAndSortsTensorsByHarm) {
    const std::string page = html_report(report_with("<script>alert(1)</script>"));
    EXPECT_EQ(page.find("<script"), std::string::npos) << "a tensor name must not become markup";
    EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
    // The 12 dB tensor is drawn before the 41 dB one: most harmful first.
    const auto errors = page.find("id=\"errors\"");
    ASSERT_NE(errors, std::string::npos);
    EXPECT_LT(page.find("12.0 dB", errors), page.find("41.0 dB", errors));
    for (const char* section : {"summary", "histograms", "plan", "phases", "settings"})
        EXPECT_NE(page.find(std::string("id=\"") + section + "\""), std::string::npos) << section;
}

// A tensor below 0 dB draws a bar (the axis starts below the lowest value),
// the error is drawn along graph order too, and a poor output's advice comes first.
TEST(HtmlReport, NegativeErrorsDrawBarsAndAPoorOutputsAdviceComesFirst) {
    auto report = report_with("bad");
    report["evaluation"]["tensors"][1]["sqnr_db"] = -3.5;
    report["advice"] = {{"outputs", {{{"output", "y"}, {"sqnr_db", 1.7}}}},
                        {"warn_output_sqnr_db", 10},
                        {"where", "the error first reaches that at tensor 'bad'"},
                        {"try", {"the accurate recipe for this target", "per_channel: true"}}};
    const std::string page = html_report(report);
    const auto errors = page.find("id=\"errors\"");
    ASSERT_NE(errors, std::string::npos);
    const auto bar = page.find("-3.5 dB", errors);
    ASSERT_NE(bar, std::string::npos);
    // The bar's rect precedes its value text: its width is more than the 1-pixel stub.
    const auto width_at = page.rfind("width=\"", bar);
    ASSERT_NE(width_at, std::string::npos);
    EXPECT_GT(std::stod(page.substr(width_at + 7)), 1.0) << page.substr(width_at, 40);
    EXPECT_NE(page.find("id=\"graph-order\"", errors), std::string::npos);
    const auto advice = page.find("id=\"advice\"");
    ASSERT_NE(advice, std::string::npos);
    EXPECT_LT(advice, page.find("id=\"summary\"")) << "the advice comes first";
    EXPECT_NE(page.find("<li>the accurate recipe for this target</li>", advice), std::string::npos);
    EXPECT_EQ(html_report(report_with("bad")).find("id=\"advice\""), std::string::npos) << "no advice: no box";
}

// The page draws a tensor ranking by its section's kind, whichever algorithm
// wrote it (a third party's under its own name), not by a section's name.
TEST(HtmlReport, ATensorRankingIsFoundByItsKindNotItsName) {
    const json ranked = {{{"tensor", "conv_out"}, {"role", "activation"}, {"output_sqnr_db", 7.25}},
                         {{"tensor", "w"}, {"role", "weight"}, {"output_sqnr_db", "inf"}}};
    auto report = report_with("bad");
    report["sensitivity"] = {{"tensors", ranked}};  // no kind: not a ranking the host knows
    EXPECT_TRUE(vaiq::tensor_ranking(report).empty());
    EXPECT_EQ(html_report(report).find("Sensitivity:"), std::string::npos);
    report["clip_search"] = {{"kind", vaiq::kTensorRankingSection}, {"tensors", ranked}};
    EXPECT_EQ(vaiq::tensor_ranking(report), ranked);
    const std::string page = html_report(report);
    const auto chart = page.find("Sensitivity:");
    ASSERT_NE(chart, std::string::npos);
    EXPECT_NE(page.find("7.2 dB (activation)", chart), std::string::npos);
}

// vaiq analyze writes the page a run writes beside its JSON report.
TEST(HtmlReport, AnalyzeWritesThePageBesideItsReport) {
    const auto dir = vaiq::test::temp_dir();
    const auto r =
        run_command(std::string(VAIQ_CLI) + " -q analyze " VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml --report " +
                    (dir / "a.json").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto page = slurp(dir / "a.html");
    for (const char* id : {"id=\"summary\"", "id=\"errors\"", "id=\"graph-order\"", "Sensitivity"})
        EXPECT_NE(page.find(id), std::string::npos) << id;
    EXPECT_FALSE(fs::exists(dir / "mnist_cnn_npu.onnx")) << "analyze writes no model";
    // In the same headless Chromium as the run's page: clean, and every chart drawn.
    const auto shown = run_command("NODE_PATH=" + vaiq::test::npm_modules().string() +
                                   " " VAIQ_NODE " " VAIQ_SOURCE_DIR "/plugins/reports/html/render_report.js " +
                                   (dir / "a.html").string());
    ASSERT_EQ(shown.exit_code, 0) << shown.err;
    const auto seen = json::parse(shown.out);
    EXPECT_TRUE(seen["console"].empty() && seen["page_errors"].empty()) << seen.dump();
    int charts = 0, histograms = 0;
    for (const auto& chart : seen["charts"]) {
        EXPECT_GT(chart["marks"].get<int>(), 0) << chart.dump();
        charts += chart["class"] == "chart";
        histograms += chart["class"] == "hist";
    }
    EXPECT_EQ(charts, 4) << "error per tensor, along the graph, sensitivity, phase times";
    // One histogram per measured tensor that has a calibrated range (the report's tensors).
    const auto report = json::parse(slurp(dir / "a.json"));
    std::set<std::string> ranged;
    for (const auto& t : report["tensors"])
        if (t.contains("range")) ranged.insert(t["tensor"].get<std::string>());
    int measured = 0;
    for (const auto& t : report["evaluation"]["tensors"]) measured += ranged.count(t["tensor"].get<std::string>());
    EXPECT_GT(measured, 0);
    EXPECT_EQ(histograms, measured);
}

TEST(HtmlReport, AReportThatStoppedEarlyStillMakesAPage) {
    for (const json& report : {json::object(), json{{"stopped_after", "plan"}, {"quantized", false}},
                               json{{"evaluation", {{"tensors", {{{"tensor", "x"}, {"sqnr_db", nullptr}}}}}}}}) {
        const std::string page = html_report(report);
        EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
        EXPECT_NE(page.find("</html>"), std::string::npos);
    }
}

// The bundled example's NPU run, its page opened in headless Chromium: no console
// message, no page error, no failed request, and every chart drawn with marks.
// VAIQ_REPORT_SCREENSHOT=PATH saves what Chromium rendered (docs/ has one).
TEST(HtmlReport, TheExamplesPageRendersInChromiumWithItsCharts) {
    const auto dir = vaiq::test::temp_dir();
    auto r = run_command(std::string(VAIQ_CLI) + " -q run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml --output " +
                         (dir / "mnist.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const fs::path page = dir / "mnist.report.html";
    ASSERT_TRUE(fs::exists(page));
    const char* shot = std::getenv("VAIQ_REPORT_SCREENSHOT");
    r = run_command("NODE_PATH=" + vaiq::test::npm_modules().string() +
                    " " VAIQ_NODE " " VAIQ_SOURCE_DIR "/plugins/reports/html/render_report.js " + page.string() +
                    (shot ? std::string(" ") + shot : ""));
    ASSERT_EQ(r.exit_code, 0) << r.err
                              << "\n(scripts/install-ort.sh installs playwright-core; scripts/install-deps.sh "
                                 "installs chromium)";
    const auto seen = json::parse(r.out);
    EXPECT_TRUE(seen["console"].empty()) << seen["console"].dump();
    EXPECT_TRUE(seen["page_errors"].empty()) << seen["page_errors"].dump();
    EXPECT_TRUE(seen["failed_requests"].empty()) << seen["failed_requests"].dump();
    int bar_charts = 0, histograms = 0;
    for (const auto& chart : seen["charts"]) {
        EXPECT_GT(chart["width"].get<double>(), 100) << chart.dump();
        EXPECT_GT(chart["height"].get<double>(), 50) << chart.dump();
        EXPECT_GT(chart["marks"].get<int>(), 0) << chart.dump();
        bar_charts += chart["class"] == "chart";
        histograms += chart["class"] == "hist";
    }
    EXPECT_EQ(bar_charts, 3) << "error per tensor, the same along the graph, and phase times";
    const auto report = json::parse(slurp(dir / "mnist.report.json"));
    EXPECT_EQ(histograms, static_cast<int>(report["evaluation"]["tensors"].size()));
    EXPECT_GE(histograms, 5);
    const auto sections = seen["sections"].get<std::vector<std::string>>();
    for (const char* s : {"summary", "errors", "histograms", "constraints", "plan", "phases"})
        EXPECT_NE(std::find(sections.begin(), sections.end(), s), sections.end()) << s;
}

TEST(HtmlReport, ReportHtmlFalseWritesOnlyTheJson) {
    const auto dir = vaiq::test::temp_dir();
    const auto r =
        run_command(std::string(VAIQ_CLI) +
                    " -q run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_cpu.yaml --set report_html=false --output " +
                    (dir / "m.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir / "m.report.json"));
    EXPECT_FALSE(fs::exists(dir / "m.report.html"));
}
