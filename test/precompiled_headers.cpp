// Empty on purpose: the target tests_pch exists to build the precompiled headers every test
// target reuses (test/CMakeLists.txt, target_precompile_headers ... REUSE_FROM tests_pch).
