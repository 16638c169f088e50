// markdown_summary: a third-party report that writes the run's outcome as a
// short Markdown page beside the JSON report (for a pull request's comment or
// a CI log): each output's SQNR and the settings the recipe changed.
#include <vaiq/vaiq.hpp>

#include <fmt/format.h>

namespace {

class MarkdownSummary final : public vaiq::ReportWriter {
  public:
    void configure(const vaiq::Options& options) override { title_ = options.get_string("title"); }

    std::string extension() const override { return ".md"; }

    std::string render(const nlohmann::json& report) const override {
        std::string out = fmt::format("# {}\n\n| output | SQNR (dB) |\n| --- | --- |\n", title_);
        const auto evaluation = report.value("evaluation", nlohmann::json::object());
        for (const auto& o : evaluation.value("outputs", nlohmann::json::array()))
            out += fmt::format("| {} | {} |\n", o.value("name", "?"), o.value("sqnr_db", nlohmann::json()).dump());
        const auto ranking = vaiq::tensor_ranking(report);
        if (!ranking.empty()) out += fmt::format("\nMost harmful tensor: {}\n", ranking[0].value("tensor", "?"));
        return out;
    }

  private:
    std::string title_;
};

constexpr vaiq_option_descriptor kOptions[] = {
    {"title", VAIQ_OPTION_STRING, "vaiq run", "The page's heading."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<MarkdownSummary>("markdown_summary", "1.0.0",
                                             "The run's output SQNRs as a Markdown table beside the report", kOptions))
