// The target that compiles the tests' precompiled header (cmake/VaiqPch.cmake);
// it runs nothing.
int main() { return 0; }
