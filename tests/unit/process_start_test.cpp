// When the command line starts again: glibc's heap in transparent huge pages, OpenMP's idle threads spinning briefly.
#include <gtest/gtest.h>

#include "util/process_start.hpp"

using vaiq::openmp_spin_count;
using vaiq::tunables_for_huge_pages;

namespace {

constexpr const char* kMadvise = "always [madvise] never\n";

TEST(HugePages, AreAskedForWhereTheKernelGivesThemOnRequest) {
    EXPECT_EQ(tunables_for_huge_pages(nullptr, kMadvise, nullptr), "glibc.malloc.hugetlb=1");
    EXPECT_EQ(tunables_for_huge_pages("", kMadvise, nullptr), "glibc.malloc.hugetlb=1");
}

TEST(HugePages, KeepTheUsersOtherTunables) {
    EXPECT_EQ(tunables_for_huge_pages("glibc.malloc.arena_max=2", kMadvise, nullptr),
              "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
}

TEST(HugePages, LeaveAUsersOwnChoiceAndAStartedAgainProcessAlone) {
    EXPECT_EQ(tunables_for_huge_pages("glibc.malloc.hugetlb=0", kMadvise, nullptr), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", kMadvise, nullptr),
              std::nullopt);
}

TEST(HugePages, AreNotAskedForWhenTheKernelAlwaysOrNeverGivesThem) {
    EXPECT_EQ(tunables_for_huge_pages(nullptr, "[always] madvise never\n", nullptr), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages(nullptr, "always madvise [never]\n", nullptr), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages(nullptr, "", nullptr), std::nullopt);  // no THP in this kernel
}

TEST(HugePages, AreNotAskedForUnderValgrindWhichWouldNotFollowTheRestart) {
    const char* valgrind =
        "/usr/libexec/valgrind/vgpreload_core-amd64-linux.so:"
        "/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so";
    EXPECT_EQ(tunables_for_huge_pages(nullptr, kMadvise, valgrind), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages(nullptr, kMadvise, "/usr/lib/libother.so"), "glibc.malloc.hugetlb=1");
}

}  // namespace

TEST(OpenMpWait, IdleThreadsSpinBrieflyUnlessTheUserChoseHowTheyWait) {
    EXPECT_EQ(openmp_spin_count(nullptr, nullptr), "5000");
    EXPECT_EQ(openmp_spin_count("passive", nullptr), std::nullopt);
    EXPECT_EQ(openmp_spin_count("active", nullptr), std::nullopt);
    EXPECT_EQ(openmp_spin_count(nullptr, "300000"), std::nullopt);
}
