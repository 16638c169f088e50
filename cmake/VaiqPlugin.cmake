# vaiq_add_plugin(NAME <name> KIND <calibrator|format|target|pass|algorithm|reader|report> SOURCES <src>...
#                 [OUTPUT_DIRECTORY <dir>] [INSTALL])
#
# Builds a vaiq plugin: a MODULE library named vaiq-<kind>-<name>.so that links
# libvaiq, hides every symbol but the entry (vaiq_plugin_entry) and lands in
# OUTPUT_DIRECTORY (default: the current binary dir). The target is called
# vaiq-<kind>-<name>. With INSTALL it is installed beside the built-in plugins.
include_guard(GLOBAL)
set(_VAIQ_PLUGIN_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

function(vaiq_add_plugin)
  cmake_parse_arguments(ARG "INSTALL" "NAME;KIND;OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT ARG_NAME OR NOT ARG_KIND OR NOT ARG_SOURCES)
    message(FATAL_ERROR "vaiq_add_plugin: NAME, KIND and SOURCES are required")
  endif()
  set(_kinds calibrator format target pass algorithm reader report)
  if(NOT ARG_KIND IN_LIST _kinds)
    message(FATAL_ERROR "vaiq_add_plugin(${ARG_NAME}): KIND '${ARG_KIND}' is not one of ${_kinds}")
  endif()
  if(NOT ARG_NAME MATCHES "^[a-z][a-z0-9_]*$")
    message(FATAL_ERROR "vaiq_add_plugin: NAME '${ARG_NAME}' must match [a-z][a-z0-9_]*")
  endif()
  set(_target vaiq-${ARG_KIND}-${ARG_NAME})
  add_library(${_target} MODULE ${ARG_SOURCES})
  if(TARGET vaiq::vaiq)
    target_link_libraries(${_target} PRIVATE vaiq::vaiq)
  else()
    target_link_libraries(${_target} PRIVATE vaiq)
  endif()
  set_target_properties(${_target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME ${_target}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${_target} PRIVATE
    "LINKER:--version-script=${_VAIQ_PLUGIN_CMAKE_DIR}/vaiq_plugin.map" "LINKER:--no-undefined")
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${_target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  endif()
  if(ARG_INSTALL)
    include(GNUInstallDirs)
    install(TARGETS ${_target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/vaiq/plugins)
    set_target_properties(${_target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
  endif()
endfunction()
