// When the command line starts again with glibc's heap in transparent huge pages.
#include <gtest/gtest.h>

#include "util/huge_pages.hpp"

using vaiq::tunables_for_huge_pages;

namespace {

constexpr const char* kMadvise = "always [madvise] never\n";

TEST(HugePages, AreAskedForWhereTheKernelGivesThemOnRequest) {
    EXPECT_EQ(tunables_for_huge_pages(nullptr, kMadvise), "glibc.malloc.hugetlb=1");
    EXPECT_EQ(tunables_for_huge_pages("", kMadvise), "glibc.malloc.hugetlb=1");
}

TEST(HugePages, KeepTheUsersOtherTunables) {
    EXPECT_EQ(tunables_for_huge_pages("glibc.malloc.arena_max=2", kMadvise),
              "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
}

TEST(HugePages, LeaveAUsersOwnChoiceAndAStartedAgainProcessAlone) {
    EXPECT_EQ(tunables_for_huge_pages("glibc.malloc.hugetlb=0", kMadvise), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", kMadvise), std::nullopt);
}

TEST(HugePages, AreNotAskedForWhenTheKernelAlwaysOrNeverGivesThem) {
    EXPECT_EQ(tunables_for_huge_pages(nullptr, "[always] madvise never\n"), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages(nullptr, "always madvise [never]\n"), std::nullopt);
    EXPECT_EQ(tunables_for_huge_pages(nullptr, ""), std::nullopt);  // no THP in this kernel
}

}  // namespace
