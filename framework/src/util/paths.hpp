// Where vaiq's own files are, found from libvaiq's location so that a build
// tree and an installation (at any prefix) work alike.
#pragma once

#include <filesystem>
#include <vector>

namespace vaiq {

/// The folder holding libvaiq.
std::filesystem::path library_dir();

/// The entries of a colon-separated path list in an environment variable
/// (empty entries skipped); none when the variable is unset.
std::vector<std::filesystem::path> path_list_from_env(const char* variable);

/// The folder `output` is written into; throws InputError when it does not exist
/// (checked before a long run, not at its end).
std::filesystem::path output_folder(const std::filesystem::path& output);

/// Folders with the shipped recipes: VAIQ_RECIPE_PATH entries first, then the
/// installed recipes beside libvaiq, then the source tree's (for a build tree).
std::vector<std::filesystem::path> recipe_search_path();

}  // namespace vaiq
