// What the command line's process must have in its environment from its start:
// glibc reads its tunables and libgomp its wait policy before main runs, so the
// command starts itself again with them set (once, before any thread starts).
//
// glibc's heap in transparent huge pages: where the kernel gives huge pages only on request (THP "madvise", the
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

/// OpenMP's idle threads spin before they sleep: libgomp's default is 300,000
/// turns, and on a machine whose cores other processes keep busy a spinning
/// thread holds the core its team's working thread needs. The recognizer's int8
/// model at 2 threads beside two busy processes: 556-1244 ms a run with the
/// default, 50-70 ms with 5,000 turns, 21-28 ms passive; alone 10-11 ms with
/// the default or 5,000 turns, about 15 % slower passive. The GOMP_SPINCOUNT to
/// start with (5,000), or nothing where the user chose (OMP_WAIT_POLICY or
/// GOMP_SPINCOUNT set: their choice stands).
std::optional<std::string> openmp_spin_count(const char* wait_policy, const char* spin_count);

/// Re-executes this program with what tunables_for_huge_pages() and
/// openmp_spin_count() ask for, when either asks for anything (not under
/// valgrind, which would not follow); returns, doing nothing, otherwise or when
/// that fails. Call first thing in main, before any thread starts.
void restart_tuned(char** argv);

}  // namespace vaiq
