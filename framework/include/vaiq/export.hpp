// vaiq/export.hpp - symbol visibility for the SDK.
#pragma once

// Plugins build with hidden visibility; every SDK class and function is marked
// visible so that a plugin's references to it (vtables, typeinfo for exceptions,
// functions) resolve to libvaiq.
#define VAIQ_API __attribute__((visibility("default")))
