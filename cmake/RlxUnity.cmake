# rlx_unity(TARGET...): join each target's C++ sources into translation units of 8 (a unity
# build), written by rlx itself rather than by CMake's UNITY_BUILD.
#
# Why not UNITY_BUILD: CMake 3.25 writes `#include "/absolute/path/src/x.cpp"` into its unity
# files, so a clone at another path (CI's fresh clone) hashes differently and misses ccache for
# every batch, several minutes of a build. These files name their sources relative to
# themselves, the way ccache's base_dir sees every other path, so any clone of the same commit
# hits the same cache entries. (CMake 3.32's UNITY_BUILD_RELOCATABLE does the same.)
#
# Left out of the batches, as CMake does: sources with their own compile options, definitions,
# flags or include directories, generated sources, and those marked SKIP_UNITY_BUILD_INCLUSION.
# Call it once every source is added (CUDA builds add some after the module is defined).
set(RLX_UNITY_BATCH_SIZE 8 CACHE STRING "Sources per unity translation unit (rlx_unity)")

function(rlx_unity)
  foreach(target ${ARGV})
    get_target_property(sources ${target} SOURCES)
    get_target_property(source_dir ${target} SOURCE_DIR)
    get_target_property(binary_dir ${target} BINARY_DIR)
    set(out_dir ${binary_dir}/CMakeFiles/${target}.dir/rlx_unity)
    set(kept)
    set(batched)
    foreach(s ${sources})
      if(s MATCHES "^\\$<" OR NOT s MATCHES "\\.(cpp|cc|cxx)$")
        list(APPEND kept ${s})
        continue()
      endif()
      get_filename_component(path ${s} ABSOLUTE BASE_DIR ${source_dir})
      set(alone FALSE)
      foreach(p SKIP_UNITY_BUILD_INCLUSION COMPILE_OPTIONS COMPILE_DEFINITIONS COMPILE_FLAGS INCLUDE_DIRECTORIES
                GENERATED HEADER_FILE_ONLY)
        get_source_file_property(v ${path} TARGET_DIRECTORY ${target} ${p})
        if(v)
          set(alone TRUE)
        endif()
      endforeach()
      if(alone)
        list(APPEND kept ${s})
      else()
        list(APPEND batched ${path})
      endif()
    endforeach()
    list(LENGTH batched n)
    if(n LESS 2)  # nothing to join
      continue()
    endif()
    set(index 0)
    set(units)
    while(batched)
      list(LENGTH batched left)
      list(SUBLIST batched 0 ${RLX_UNITY_BATCH_SIZE} members)
      if(left GREATER RLX_UNITY_BATCH_SIZE)
        list(SUBLIST batched ${RLX_UNITY_BATCH_SIZE} -1 batched)
      else()
        set(batched)
      endif()
      set(text "/* rlx_unity (cmake/RlxUnity.cmake): sources of ${target}, named relative to this file */\n")
      foreach(m ${members})
        file(RELATIVE_PATH rel ${out_dir} ${m})
        string(APPEND text "#include \"${rel}\"\n")
      endforeach()
      set(unit ${out_dir}/unity_${index}.cpp)
      file(CONFIGURE OUTPUT ${unit} CONTENT "${text}")  # rewritten only when it changes
      list(APPEND units ${unit})
      math(EXPR index "${index} + 1")
    endwhile()
    set_property(TARGET ${target} PROPERTY SOURCES ${kept} ${units})
  endforeach()
endfunction()
