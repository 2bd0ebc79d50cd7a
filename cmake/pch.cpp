// The translation unit that builds the precompiled header every LibTorch module of librlx
// reuses (CMakeLists.txt, rlx_pch). It has no code of its own.
