#pragma once
// Where this build put the files rlx finds at run time, and where `cmake --install` puts
// them. Defined in a source CMake generates (build_paths.cpp in the build tree), not as
// compile definitions: a path on a compiler's command line is part of what ccache hashes,
// so every checkout at another path compiled each file that had one again.

namespace rlx::build_paths {

extern const char* const kSandboxHelperBuild;    // the build tree's rlx-sandbox-helper
extern const char* const kSandboxHelperInstall;  // the installed one (libexec)
extern const char* const kPlotScriptSource;      // the source tree's scripts/plot_metrics.py
extern const char* const kPlotScriptInstall;     // the installed one (share/rlx)

}  // namespace rlx::build_paths
