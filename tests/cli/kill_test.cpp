// vaiq killed with SIGKILL at many moments of `run`, `preprocess` and
// `convert-opset`: the input model stays byte for byte what it was, the output
// path holds nothing or a complete valid model, and what a killed process left
// behind is a clearly named temporary that the next write of that file removes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test_support.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

extern char** environ;

namespace fs = std::filesystem;
using vaiq::test::slurp;

namespace {

struct Child {
    pid_t pid = -1;
    int err = -1;  ///< the read end of its stderr, when asked for
};

Child spawn(const std::vector<std::string>& args, bool capture_stderr) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    int pipe_fds[2] = {-1, -1};
    if (capture_stderr) {
        if (::pipe(pipe_fds) != 0) return {};
        posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
        posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    } else {
        posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    }
    Child child;
    if (posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) child.pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    if (capture_stderr) {
        ::close(pipe_fds[1]);
        child.err = pipe_fds[0];
    }
    return child;
}

// Returns whether the process had already finished when the kill came.
bool kill_and_reap(const Child& child) {
    int status = 0;
    const bool finished = ::waitpid(child.pid, &status, WNOHANG) == child.pid;
    if (!finished) {
        ::kill(child.pid, SIGKILL);
        ::waitpid(child.pid, &status, 0);
    }
    if (child.err >= 0) ::close(child.err);
    return finished;
}

// Reads the child's stderr until a line contains `marker` (or the stream ends).
bool wait_for_line(int fd, const std::string& marker) {
    std::string seen;
    char buffer[4096];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) {
        seen.append(buffer, static_cast<size_t>(n));
        if (seen.find(marker) != std::string::npos) return true;
    }
    return false;
}

double seconds_to_finish(const std::vector<std::string>& args) {
    const auto start = std::chrono::steady_clock::now();
    const Child c = spawn(args, false);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the command must succeed unkilled";
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class KillTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = vaiq::test::temp_dir();
        input_ = dir_ / "in.onnx";
        fs::copy_file(VAIQ_SOURCE_DIR "/examples/mnist/mnist_cnn.onnx", input_);
        original_ = slurp(input_);
    }

    // After a kill: the input untouched; each output either absent or complete;
    // temporaries named after their file and the killed process.
    void check(pid_t killed, const std::vector<fs::path>& outputs, const std::string& when) {
        ASSERT_EQ(slurp(input_), original_) << when << ": the input model changed";
        for (const auto& out : outputs) {
            if (!fs::exists(out)) continue;
            if (out.extension() == ".onnx") {
                EXPECT_NO_THROW(vaiq::check_model(vaiq::load_model(out))) << when << ": " << out << " is not valid";
            } else if (out.extension() == ".json") {
                EXPECT_TRUE(nlohmann::json::accept(slurp(out))) << when << ": " << out << " is cut short";
            } else if (out.extension() == ".html") {
                const auto page = slurp(out);
                EXPECT_NE(page.find("</html>"), std::string::npos) << when << ": " << out << " is cut short";
            }
        }
        const std::regex temporary(R"(\.(.+)\.tmp-(\d+)-[0-9a-f]{8})");
        for (const auto& entry : fs::directory_iterator(dir_)) {
            const auto name = entry.path().filename().string();
            if (entry.path() == input_ || std::find(outputs.begin(), outputs.end(), entry.path()) != outputs.end())
                continue;
            std::smatch m;
            ASSERT_TRUE(std::regex_match(name, m, temporary)) << when << ": unexpected file " << name;
            EXPECT_EQ(std::stoi(m[2]), killed) << when << ": " << name << " is not the killed process's";
            EXPECT_TRUE(fs::exists(dir_ / m[1].str()) || std::find(outputs.begin(), outputs.end(), dir_ / m[1].str()) !=
                                                             outputs.end())
                << when << ": " << name << " names no output";
        }
    }

    void clear(const std::vector<fs::path>& outputs) {
        for (const auto& out : outputs) fs::remove(out);
        for (const auto& entry : fs::directory_iterator(dir_))
            if (entry.path().filename().string().find(".tmp-") != std::string::npos) fs::remove(entry.path());
    }

    // Kills `args` ({vaiq, --log-level, L, command, ...}) at `points` moments spread
    // over its unkilled duration (the faster of two runs: the first warms the
    // caches); returns how many landed before it ended.
    int kill_by_time(const std::vector<std::string>& args, const std::vector<fs::path>& outputs, int points) {
        const double full = std::min(seconds_to_finish(args), seconds_to_finish(args));
        clear(outputs);
        int interrupted = 0;
        for (int k = 0; k < points; ++k) {
            const auto delay = std::chrono::duration<double>(full * k / points);
            const Child child = spawn(args, false);
            std::this_thread::sleep_for(delay);
            interrupted += !kill_and_reap(child);
            check(child.pid, outputs, args[3] + " killed after " + std::to_string(delay.count()) + " s");
            if (HasFatalFailure()) return interrupted;
            clear(outputs);
        }
        return interrupted;
    }

    fs::path dir_, input_;
    std::string original_;
};

const std::string kCli = VAIQ_CLI;

TEST_F(KillTest, RunKilledAtManyMomentsAndAtEveryPhase) {
    const auto out = dir_ / "out.onnx";
    const std::vector<fs::path> outputs{out, dir_ / "out.report.json", dir_ / "out.report.html"};
    const std::vector<std::string> run{kCli,     "--log-level", "debug", "run", VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml",
                                       "--model", input_.string(), "--output", out.string()};
    constexpr int kMoments = VAIQ_KILL_MOMENTS;
    const int interrupted = kill_by_time(run, outputs, kMoments);
    std::cout << "kills that cut vaiq run short: " << interrupted << " of " << kMoments << "\n";
    // Timing on a loaded machine varies; most kills still land while the run is going on.
    EXPECT_GE(interrupted, kMoments * 3 / 8) << "kills must land while the run is going on";
    // At the end of every phase (its "took" line), so that each phase's work is cut.
    for (const char* phase : {"setup", "load", "prepare", "plan", "calibrate", "parameters", "emit", "check",
                              "evaluate"}) {
        const Child child = spawn(run, true);
        ASSERT_TRUE(wait_for_line(child.err, std::string("phase ") + phase + " took")) << phase;
        kill_and_reap(child);
        check(child.pid, outputs, std::string("run killed after phase ") + phase);
        if (HasFatalFailure()) return;
        clear(outputs);
    }
    // A killed write leaves `.out.onnx.tmp-<pid>-<hex>`; the next write of out.onnx removes it.
    const auto stale = dir_ / (".out.onnx.tmp-" + std::to_string(999999) + "-0badf00d");
    vaiq::test::write_text(stale, "half a model");
    ASSERT_EQ(vaiq::test::run_command(kCli + " -q run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml --model " +
                                      input_.string() + " --output " + out.string())
                  .exit_code,
              0);
    EXPECT_FALSE(fs::exists(stale)) << "a dead process's temporary is removed by the next write of its file";
    check(-1, outputs, "after a complete run");
}

// All the tensors of a model, its external data read.
std::map<std::string, std::string> tensor_bytes(const fs::path& model) {
    std::map<std::string, std::string> out;
    const auto loaded = vaiq::load_model(model);
    for (const auto& init : loaded.graph().initializer()) {
        const auto tensor = vaiq::Tensor::from_proto(init);
        const auto bytes = tensor.bytes();
        out[init.name()] = std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    return out;
}

// A re-run over an output that keeps its tensors in a data file replaces two
// files. Killed between their renames (at the failpoints, which no timer hits),
// the output holds the old model with the old data or no model: never the old
// model reading the new run's data.
TEST_F(KillTest, ReRunOverExternalDataKilledBetweenItsRenamesNeverPairsOldAndNew) {
    const auto out = dir_ / "out.onnx";
    const auto data = dir_ / "out.onnx.data";
    auto run = [&](const std::string& weight_type, const char* failpoint) {
        const std::string env = failpoint ? std::string("VAIQ_FAILPOINT=") + failpoint + " " : std::string();
        return vaiq::test::run_command(env + kCli + " -q run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " +
                                       input_.string() + " --output " + out.string() +
                                       " --set use_external_data_format=true --set external_data_size_threshold=0" +
                                       " --set report_html=false --set weight_type=" + weight_type);
    };
    ASSERT_EQ(run("QInt8", nullptr).exit_code, 0);
    ASSERT_TRUE(fs::exists(data));
    const auto old_tensors = tensor_bytes(out);
    ASSERT_EQ(run("QUInt8", nullptr).exit_code, 0);
    const auto new_tensors = tensor_bytes(out);
    ASSERT_NE(old_tensors, new_tensors) << "the two runs must write different weights";
    for (const char* point : {"save:before-renames", "save:data-renamed"}) {
        ASSERT_EQ(run("QInt8", nullptr).exit_code, 0);  // the old output again
        const auto r = run("QUInt8", point);
        EXPECT_NE(r.exit_code, 0) << point << ": the failpoint must kill the run";
        EXPECT_EQ(slurp(input_), original_) << point;
        if (!fs::exists(out)) continue;
        EXPECT_EQ(tensor_bytes(out), old_tensors) << point << ": the model left behind must read its own data";
    }
    ASSERT_EQ(run("QUInt8", nullptr).exit_code, 0) << "the next run cleans up and completes";
    EXPECT_EQ(tensor_bytes(out), new_tensors);
    for (const auto& entry : fs::directory_iterator(dir_))
        EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
            << entry.path() << " left behind by a killed run";
}

TEST_F(KillTest, PreprocessAndConvertOpsetKilledAtTenMomentsEach) {
    const auto pre = dir_ / "pre.onnx";
    const int pre_cut = kill_by_time({kCli, "--log-level", "debug", "preprocess", input_.string(), pre.string()}, {pre}, 10);
    if (HasFatalFailure()) return;
    const auto converted = dir_ / "converted.onnx";
    const int convert_cut = kill_by_time(
        {kCli, "--log-level", "debug", "convert-opset", input_.string(), converted.string(), "--opset", "17"}, {converted},
        10);
    std::cout << "kills that cut the command short: preprocess " << pre_cut << " of 10, convert-opset " << convert_cut
              << " of 10\n";
    EXPECT_GE(pre_cut, 3);
    EXPECT_GE(convert_cut, 3);
}

}  // namespace
