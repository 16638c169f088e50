// glibc's heap in transparent huge pages, for the command line.
//
// Where the kernel gives huge pages only on request (THP "madvise", the
// default of most distributions), every 4 KB page the heap touches first is a
// fault of its own, and on a virtual machine a costly one: loading resnet50,
// laying out its weights and running it once took 1.56 s, 0.62-1.06 s in huge
// pages. glibc asks for them when its tunable glibc.malloc.hugetlb is 1; the
// heap is set up before main, so the tunable must be in the environment when
// the process starts.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace vaiq {

/// The GLIBC_TUNABLES value to start again with, or nothing when there is no
/// need: the user set glibc.malloc.hugetlb already (their choice stands), the
/// kernel's THP mode (`thp_enabled`, as /sys/kernel/mm/transparent_hugepage/enabled
/// reads) is "always" (the heap has them) or "never" (none to have), or the
/// process runs under valgrind (`ld_preload` names its vgpreload libraries),
/// which would not follow the restart into the new program.
std::optional<std::string> tunables_for_huge_pages(const char* current, std::string_view thp_enabled,
                                                   const char* ld_preload);

/// Re-executes this program with glibc.malloc.hugetlb=1 when
/// tunables_for_huge_pages() says so; returns (doing nothing) otherwise or when
/// that fails. Call first thing in main, before any thread starts.
void restart_with_huge_pages(char** argv);

}  // namespace vaiq
