// The HTML report: its content from a report, and the page as Chromium renders it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

#include "report/html_report.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using vaiq::html_report;
using vaiq::test::run_command;
using vaiq::test::slurp;

namespace {

json histogram() { return {{"min", -1.0}, {"max", 1.0}, {"counts", {1, 5, 0, 2}}}; }

json report_with(const std::string& bad_name) {
    return {{"vaiq_version", "0.1.0"},
            {"model", {{"input", "in.onnx"}, {"output", "out.onnx"}, {"nodes", 3}}},
            {"recipe", {{"name", "r"}, {"settings", {{"target", {{"value", "cpu"}, {"origin", "r.yaml:2:1"}}}}}}},
            {"tensors",
             {{{"tensor", "good"}, {"role", "activation"}, {"type", "QUInt8"}, {"range", {-1, 1}}, {"scale", 0.01},
               {"zero_point", 128}},
              {{"tensor", bad_name}, {"role", "activation"}, {"type", "QUInt8"}, {"range", {-1, 1}}, {"scale", 0.01},
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
    r = run_command("NODE_PATH=" + vaiq::test::npm_modules().string() + " " VAIQ_NODE " " VAIQ_SOURCE_DIR
                    "/tests/report/render_report.js " + page.string() + (shot ? std::string(" ") + shot : ""));
    ASSERT_EQ(r.exit_code, 0) << r.err << "\n(scripts/install-ort.sh installs playwright-core; scripts/install-deps.sh "
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
    EXPECT_EQ(bar_charts, 2) << "error per tensor and phase times";
    const auto report = json::parse(slurp(dir / "mnist.report.json"));
    EXPECT_EQ(histograms, static_cast<int>(report["evaluation"]["tensors"].size()));
    EXPECT_GE(histograms, 5);
    const auto sections = seen["sections"].get<std::vector<std::string>>();
    for (const char* s : {"summary", "errors", "histograms", "constraints", "plan", "phases"})
        EXPECT_NE(std::find(sections.begin(), sections.end(), s), sections.end()) << s;
}

TEST(HtmlReport, ReportHtmlFalseWritesOnlyTheJson) {
    const auto dir = vaiq::test::temp_dir();
    const auto r = run_command(std::string(VAIQ_CLI) + " -q run " VAIQ_SOURCE_DIR
                               "/examples/mnist/mnist_cpu.yaml --set report_html=false --output " +
                               (dir / "m.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir / "m.report.json"));
    EXPECT_FALSE(fs::exists(dir / "m.report.html"));
}
