// What the command line's process must have in its environment from its start:
// libgomp reads its wait policy before main runs, so the command starts itself
// again with it set (once, before any thread starts).
//
// glibc's heap is left in 4 KB pages. Transparent huge pages for it
// (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which a user may still set) fault
// 2 MB at a time; on a virtual machine whose host takes back the memory the
// guest frees (free page reporting), each such fault after a pause costs
// milliseconds: touching 512 MB took 4.5 s in huge pages against 0.18 s in
// 4 KB pages, and resnet50's whole `cnn_npu.yaml` run 7.9 s against 5.1.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace vaiq {

/// OpenMP's idle threads spin before they sleep: libgomp's default is 300,000
/// turns, and on a machine whose cores other processes keep busy a spinning
/// thread holds the core its team's working thread needs. The recognizer's int8
/// model at 2 threads beside two busy processes: 556-1244 ms a run with the
/// default, 50-70 ms with 5,000 turns, 21-28 ms passive; alone 10-11 ms with
/// the default or 5,000 turns, about 15 % slower passive. The GOMP_SPINCOUNT to
/// start with (5,000), or nothing where the user chose (OMP_WAIT_POLICY or
/// GOMP_SPINCOUNT set: their choice stands).
std::optional<std::string> openmp_spin_count(const char* wait_policy, const char* spin_count);

/// Re-executes this program with what openmp_spin_count() asks for, when it
/// asks for anything (not under valgrind, which would not follow the restart
/// into the new program); returns, doing nothing, otherwise or when that
/// fails. Call first thing in main, before any thread starts.
void restart_tuned(char** argv);

}  // namespace vaiq
